"""`GET /pool/snapshot` on a real daemon (sim executor): the token guards it, the body is a
`BoxSnapshot`: the box as one placement target over every instance, and every model's profile;
`?since=` a token gets only the session entries that changed since; `?stream=1` the answers of
held polls as frames of one response, ended when the daemon drains."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from talariad.admin.client import AdminClient
from talariad.wire.box import AGE_HEADER, SNAPSHOT_PATH, STREAM_TYPE, BoxSnapshot
from tests.support.daemon import start_daemon, stop_daemon

TOKEN = "pool-secret-1"

pytestmark = pytest.mark.e2e  # a real daemon on a loopback port


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("box")
    (tmp / "pool.token").write_text(f"\n{TOKEN}\n")
    d = start_daemon(tmp, {"pool": {"token_file": "pool.token"}}, executor="sim")
    yield d
    stop_daemon(d)


def _get(box, headers=None, path=SNAPSHOT_PATH):
    return httpx.get(box.endpoint + path, headers=headers or {}, timeout=5)


def test_missing_and_wrong_tokens_get_401_in_the_api_error_shape(box):
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": TOKEN}):
        r = _get(box, headers)
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and "pool token" in err["message"]
        assert r.headers["www-authenticate"] == "Bearer"


def _all_live(box, snap: BoxSnapshot) -> bool:
    """The box's target counts every instance of the box."""
    health = httpx.get(box.endpoint + "/health", timeout=5).json()
    return snap.target.instances == len(health["instances"]) > 0


def test_the_token_gets_every_instance_and_model(box):
    deadline = time.monotonic() + 20
    while True:
        r = _get(box, {"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        snap = BoxSnapshot.model_validate_json(r.content)
        if _all_live(box, snap):
            break
        assert time.monotonic() < deadline, snap
        time.sleep(0.2)
    target, health = snap.target, httpx.get(box.endpoint + "/health", timeout=5).json()
    assert {name for name, _ in target.basis} == {i["name"] for i in health["instances"]}
    assert target.healthy and target.sessions_base is None and target.age_s >= 0
    assert set(target.allowed_models) == set(target.models) and target.models
    assert snap.models and all(m.profile.decode_step_s > 0 for m in snap.models)
    again = BoxSnapshot.model_validate_json(_get(box, {"authorization": f"Bearer {TOKEN}"}).content)
    assert again.version > snap.version


def test_no_token_configured_means_no_endpoint(tmp_path):
    d = start_daemon(tmp_path, executor="sim")
    try:
        r = _get(d, {"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    finally:
        stop_daemon(d)


# --- sessions as changes (`?since=`) --------------------------------------------------------
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _snap(box, since=None) -> BoxSnapshot:
    params = {} if since is None else {"since": since}
    r = httpx.get(box.endpoint + SNAPSHOT_PATH, headers=AUTH, params=params, timeout=5)
    assert r.status_code == 200
    return BoxSnapshot.model_validate_json(r.content)


def _call(box, session: str, turns: int = 1) -> None:
    """A call in `session`; more `turns`: a longer prompt, so its prefix changes."""
    messages = [{"role": "user", "content": "hi " * turns}]
    body = {"model": "tiny-chat", "messages": messages, "max_tokens": 4}
    r = httpx.post(
        box.endpoint + "/v1/chat/completions",
        json=body,
        headers={"x-session-id": session},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def _ids(snap: BoxSnapshot) -> set[str]:
    """The sessions listed (a branch `s~KEY` counts as its session `s`)."""
    return {s.session_id.split("~")[0] for s in snap.target.sessions}


def _merge(held: dict, snap: BoxSnapshot, since: int | None) -> None:
    """`snap`, the reply to `?since=since`, merged into `held`, the view `since` names."""
    assert snap.target.sessions_base in (None, since)
    snap.target.merge_into(held)


def _whole_until(box, pred) -> BoxSnapshot:
    deadline = time.monotonic() + 20
    while not pred(snap := _snap(box)):
        assert time.monotonic() < deadline, snap
        time.sleep(0.1)
    return snap


def _quiet_token(box, token: int, held: dict) -> int:
    """A token after which nothing changes for a poll (the calls' KV settled); `held` follows."""
    deadline = time.monotonic() + 20
    while True:
        snap = _snap(box, token)
        _merge(held, snap, token)
        if not snap.target.sessions and not snap.target.sessions_removed:
            return token
        assert time.monotonic() < deadline, snap
        token = snap.sessions_epoch
        time.sleep(0.3)


def _resent(held: dict, delta: BoxSnapshot) -> list:
    """Entries `delta` lists that `held` (the view before it) already has as they are."""
    return [s for s in delta.target.sessions if held.get((s.session_id, s.model)) == s]


def test_a_token_gets_only_the_changes_and_removals(box):
    _whole_until(box, lambda s: _all_live(box, s))
    _call(box, "delta-a")
    _call(box, "delta-b")
    first = _whole_until(box, lambda s: {"delta-a", "delta-b"} <= _ids(s))
    assert first.target.sessions_base is None
    held: dict = {}
    _merge(held, first, None)
    token = _quiet_token(box, first.sessions_epoch, held)

    _call(box, "delta-a", turns=40)
    deadline = time.monotonic() + 20
    while not (delta := _snap(box, token)) or "delta-a" not in _ids(delta):
        assert time.monotonic() < deadline, delta
        time.sleep(0.1)
    # only changes: delta-a's new prefix, and any other entry only if it changed meanwhile (a
    # switch may move delta-b's prefix to the host); never an entry resent as it was
    assert _resent(held, delta) == []
    assert delta.target.sessions_base == token
    _merge(held, delta, token)

    token = _quiet_token(box, delta.sessions_epoch, held)
    AdminClient(box.socket_path).forget("delta-a")
    deadline = time.monotonic() + 20
    removed: set = set()
    while not any(k[0].startswith("delta-a") for k in removed):
        assert time.monotonic() < deadline
        time.sleep(0.1)
        delta = _snap(box, token)
        removed |= {tuple(k) for k in delta.target.sessions_removed}
    assert all(k[0].split("~")[0] == "delta-a" for k in removed)


def test_an_unknown_token_gets_the_whole_view(box):
    _call(box, "delta-c")
    whole = _whole_until(box, lambda s: "delta-c" in _ids(s))
    for since in (whole.sessions_epoch + 10**6, 0, "not-a-token"):
        snap = _snap(box, since)
        assert snap.target.sessions_base is None
        assert "delta-c" in _ids(snap)


def test_merged_changes_equal_a_fresh_whole_view(box):
    held: dict = {}
    since = None
    for n in range(6):
        snap = _snap(box, since)
        _merge(held, snap, since)
        since = snap.sessions_epoch
        _call(box, f"delta-m{n % 3}", turns=n + 1)
    deadline = time.monotonic() + 20
    wanted = {"delta-m0", "delta-m1", "delta-m2"}
    while True:  # the last changes: merged again until the two views agree and hold every call's
        delta, whole = _snap(box, since), _snap(box)  # session (the box hears of the last one
        _merge(held, delta, since)  # at its next read of the instance)
        since, fresh = delta.sessions_epoch, {}
        _merge(fresh, whole, None)
        named = {k[0].split("~")[0] for k in held}
        if held == fresh and since == whole.sessions_epoch and wanted <= named:
            break
        assert time.monotonic() < deadline, (held, fresh)
        time.sleep(0.2)


# --- conditional polls (`If-None-Match`) ----------------------------------------------------
def _conditional(held: BoxSnapshot, wait: float = 0.0) -> dict:
    """A poll that names the snapshot `held` (its etag and session view), held `wait` s."""
    return {
        "headers": {**AUTH, "if-none-match": held.etag or ""},
        "params": {"since": held.sessions_epoch, "wait": wait},
    }


def _if_changed(box, held: BoxSnapshot) -> httpx.Response:
    return httpx.get(box.endpoint + SNAPSHOT_PATH, timeout=5, **_conditional(held))


def _quiet(box) -> BoxSnapshot:
    """A snapshot a conditional poll is answered `304` for (the box idle)."""
    held = _whole_until(box, lambda s: _all_live(box, s))
    deadline = time.monotonic() + 20
    while (r := _if_changed(box, held)).status_code != 304:
        assert r.status_code == 200 and time.monotonic() < deadline, r.text
        held = BoxSnapshot.model_validate_json(r.content)
        time.sleep(0.1)
    return held


def test_a_quiet_box_answers_a_conditional_poll_with_its_age_only(box):
    held = _whole_until(box, lambda s: _all_live(box, s))
    assert held.etag
    deadline = time.monotonic() + 20
    while (r := _if_changed(box, held)).status_code != 304:  # until the box is quiet
        assert r.status_code == 200 and time.monotonic() < deadline, r.text
        held = BoxSnapshot.model_validate_json(r.content)
        assert r.headers["etag"] == held.etag
        time.sleep(0.1)
    assert r.content == b"" and r.headers["etag"] == held.etag
    assert 0 <= float(r.headers[AGE_HEADER]) < 2.0  # its instances heard from lately
    _call(box, "cond-a")
    deadline = time.monotonic() + 20
    while True:  # until the call reaches the view
        assert time.monotonic() < deadline
        if (r := _if_changed(box, held)).status_code == 304:
            time.sleep(0.1)
            continue
        changed = BoxSnapshot.model_validate_json(r.content)
        assert r.status_code == 200 and changed.etag != held.etag
        assert changed.target.sessions_base == held.sessions_epoch  # a change since the view held
        if "cond-a" in _ids(changed):
            break
        held = changed  # an earlier test's session changed first (its KV moved): a view of its own


def test_a_held_poll_is_answered_as_soon_as_the_box_changes(box):
    """Held up to the box's most (5 s) and given 4 s: answered by the change, not the hold's end."""
    held = _quiet(box)

    async def run() -> BoxSnapshot:
        nonlocal held
        async with httpx.AsyncClient(base_url=box.endpoint, timeout=4) as client:
            waiting = asyncio.create_task(client.get(SNAPSHOT_PATH, **_conditional(held, 30)))
            r = await client.post(
                "/v1/chat/completions",
                json={"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-session-id": "held-a"},
            )
            assert r.status_code == 200
            deadline = time.monotonic() + 20
            while True:  # any other change first is answered at once too; held again
                r = await waiting
                assert r.status_code == 200, r.status_code
                changed = BoxSnapshot.model_validate_json(r.content)
                if "held-a" in _ids(changed):
                    return changed
                assert time.monotonic() < deadline
                held = changed
                waiting = asyncio.create_task(client.get(SNAPSHOT_PATH, **_conditional(held, 30)))

    changed = asyncio.run(run())
    assert changed.target.sessions_base is not None and changed.etag != held.etag


# --- snapshot streams (`?stream=1`) ---------------------------------------------------------
def _stream_params(held: BoxSnapshot | None = None) -> dict:
    """A stream from the snapshot `held` (None: from nothing), ages every 0.2 s."""
    params: dict = {"stream": "1", "wait": 0.2, "gap": 0.05}
    headers = dict(AUTH)
    if held is not None:
        params["since"] = held.sessions_epoch
        headers["if-none-match"] = held.etag or ""
    return {"headers": headers, "params": params}


async def _frames(response: httpx.Response):
    """Each frame of a stream: a `BoxSnapshot`, or the target's age (a float)."""
    async for line in response.aiter_lines():
        if line:
            yield BoxSnapshot.model_validate_json(line) if line[0] == "{" else float(line)


def test_a_stream_sends_the_snapshot_its_age_while_quiet_and_then_its_changes(box):
    """Each frame is what the held poll from the frame before would be answered: the whole
    snapshot first, ages while the box says the same, then a change as sessions since."""
    _quiet(box)

    async def run() -> tuple[BoxSnapshot, BoxSnapshot, int]:
        async with httpx.AsyncClient(base_url=box.endpoint, timeout=10) as client:
            async with client.stream("GET", SNAPSHOT_PATH, **_stream_params()) as r:
                assert r.status_code == 200 and r.headers["content-type"] == STREAM_TYPE
                frames, ages = _frames(r), 0
                first = held = await anext(frames)
                assert isinstance(first, BoxSnapshot) and first.target.sessions_base is None
                assert first.models  # the first frame names them; later ones as they change
                while ages < 2:  # the box is quiet: its age, every `wait`
                    frame = await anext(frames)
                    if isinstance(frame, float):
                        assert 0 <= frame < 2.0
                        ages += 1
                    else:
                        held, ages = frame, 0
                called = asyncio.create_task(asyncio.to_thread(_call, box, "stream-a"))
                deadline = time.monotonic() + 20
                while not (isinstance(frame, BoxSnapshot) and "stream-a" in _ids(frame)):
                    assert time.monotonic() < deadline
                    if isinstance(frame, BoxSnapshot):
                        held = frame
                    frame = await anext(frames)
                await called
                assert frame.target.sessions_base == held.sessions_epoch
                return first, frame, ages

    first, changed, ages = asyncio.run(run())
    assert changed.etag != first.etag and changed.version > first.version and ages == 2


def test_a_stream_from_the_snapshot_held_begins_with_its_age(box):
    held = _quiet(box)

    async def run() -> float | BoxSnapshot:
        async with httpx.AsyncClient(base_url=box.endpoint, timeout=10) as client:
            async with client.stream("GET", SNAPSHOT_PATH, **_stream_params(held)) as r:
                return await anext(_frames(r))

    first = asyncio.run(run())
    # the box may have changed since `_quiet` (a telemetry reply that says otherwise): then
    # its first frame is the change to the view held, not the view whole
    assert isinstance(first, float) or first.target.sessions_base == held.sessions_epoch


def test_a_draining_box_ends_its_streams(tmp_path):
    """A stream would hold the daemon's drain to its grace (30 s here): the drain ends it."""
    (tmp_path / "pool.token").write_text(TOKEN)
    d = start_daemon(tmp_path, {"pool": {"token_file": "pool.token"}}, executor="sim")

    async def run() -> int:
        async with httpx.AsyncClient(base_url=d.endpoint, timeout=20) as client:
            async with client.stream("GET", SNAPSHOT_PATH, **_stream_params()) as r:
                frames = 0
                async for _ in _frames(r):
                    frames += 1
                    if frames == 1:
                        d.proc.send_signal(signal.SIGTERM)
                return frames

    try:
        assert asyncio.run(run()) >= 1  # the stream ended (not read timed out)
        assert d.proc.wait(15) == 0
    finally:
        stop_daemon(d)
