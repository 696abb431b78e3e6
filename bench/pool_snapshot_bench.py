"""A box's `GET /pool/snapshot` with many live sessions, whole against `?since=` changes: the
bytes of one poll and the picker's time per poll (parse, install), in process.

Run: .venv/bin/python bench/pool_snapshot_bench.py [--sessions 20000] [--instances 3]
     [--changes 10] [--polls 20]

The box's side is the daemon's own code (`RouterShell` merging telemetry, `PoolEndpoint` serving
it) over a stand-in for the rest of the gateway; `--changes` sessions of each instance change
between two polls (a call each: its prefix grows). The picker's side is what its poller and
`BoxPicker.box_seen` run per poll: parse, then install the box's target (its session changes
merged into the view held, `Router.observe`). Prints one row per mode (`measure`), medians over
`--polls` polls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from talariad.epp.boxpicker import BoxPicker  # noqa: E402
from talariad.gateway.pool import PoolEndpoint  # noqa: E402
from talariad.gateway.routing import RouterShell  # noqa: E402
from talariad.router import Router, RouterKnobs  # noqa: E402
from talariad.types import KVLocation, KVState  # noqa: E402
from talariad.wire.box import BoxSnapshot  # noqa: E402
from talariad.wire.messages import Telemetry  # noqa: E402

MODEL = "m"


class BenchBox:
    """The daemon's side: each instance's telemetry merged by the shell, served by the pool."""

    def __init__(self, instances: int, sessions: int) -> None:
        self.shell = RouterShell(Router(RouterKnobs(), {}))
        self.pool = PoolEndpoint("t", max_sessions=sessions)
        self.shell.merged = self.pool.log.record
        self.names = [f"i{n}" for n in range(instances)]
        self.latest: dict[str, Telemetry] = {}
        self.version, self.turn = 0, 0
        self.gw = SimpleNamespace(
            routing=self.shell,
            directory=SimpleNamespace(snapshot=self.latest.get, age_s=lambda n, now: 0.05),
            cfg=SimpleNamespace(models=[], instances=[SimpleNamespace(name=n) for n in self.names]),
            ready=lambda name: True,
        )
        for name in self.names:
            whole = [_loc(f"{name}-s{k}", 100 + k % 500) for k in range(sessions)]
            self._send(name, whole, None)

    def _send(self, name: str, sessions: list[KVLocation], base: int | None) -> None:
        self.version += 1
        t = Telemetry(
            instance=name, version=self.version, pool="hot", models=[MODEL],
            active_model=MODEL, loaded_models=[MODEL], sessions=sessions, sessions_base=base,
        )  # fmt: skip
        self.latest[name] = t
        self.shell.observe(t, time.monotonic())

    def calls(self, changes: int) -> float:
        """`changes` sessions of each instance take a call: their prefix grows. Returns the
        seconds the shell took per telemetry reply (the box's own router installing it)."""
        self.turn += 1
        t0 = time.perf_counter()
        for name in self.names:
            grown = [_loc(f"{name}-s{k}", 1000 + self.turn) for k in range(changes)]
            self._send(name, grown, self.version)
        return (time.perf_counter() - t0) / len(self.names)

    def serve(self, since: int | None) -> tuple[bytes, float]:
        t0 = time.perf_counter()
        body = self.pool.snapshot(self.gw, time.monotonic(), since).model_dump_json().encode()
        return body, time.perf_counter() - t0


def _loc(session: str, kv_len: int) -> KVLocation:
    return KVLocation(session, MODEL, KVState.DEVICE, kv_len)


def measure(box: BenchBox, mode: str, changes: int, polls: int) -> dict[str, float]:
    """Median bytes and seconds per poll of one picker polling `box`. "whole": every poll whole,
    as without `?since=`; "delta": the changes since the view held; "idle": as "delta", with no
    new telemetry between polls."""
    picker = BoxPicker(Router(RouterKnobs(), {}))
    rows: dict[str, list[float]] = {}
    for n in range(polls + 1):  # the first poll is whole in every mode: left out
        shell_s = box.calls(changes) if mode != "idle" or n == 0 else 0.0
        body, serve_s = box.serve(None if mode == "whole" else picker.since("box"))
        t0 = time.perf_counter()
        snap = BoxSnapshot.model_validate_json(body)
        t1 = time.perf_counter()
        assert picker.box_seen("box", "10.0.0.1:80", snap, time.monotonic())
        t2 = time.perf_counter()
        for key, v in (
            ("bytes", len(body)),
            ("shell", shell_s),
            ("serve", serve_s),
            ("parse", t1 - t0),
            ("install", t2 - t1),
            ("picker", t2 - t0),
        ):
            rows.setdefault(key, []).append(v)
    return {k: statistics.median(v[1:]) for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20_000, help="per instance")
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--changes", type=int, default=10, help="per instance between two polls")
    ap.add_argument("--polls", type=int, default=20)
    args = ap.parse_args()
    print(
        f"pool snapshot: {args.instances} instances x {args.sessions} sessions, "
        f"{args.changes} changed per instance between polls; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"
    )
    box = BenchBox(args.instances, args.sessions)
    ms = ("shell", "serve", "parse", "install", "picker")
    print(f"{'mode':<7}{'bytes/poll':>12}" + "".join(f"{c + ' ms':>12}" for c in ms))
    for mode in ("whole", "delta", "idle"):
        row = measure(box, mode, args.changes, args.polls)
        cells = "".join(f"{row[c] * 1e3:>12.3f}" for c in ms)
        print(f"{mode:<7}{row['bytes']:>12.0f}{cells}")
    print(
        "picker ms = parse + install (BoxPicker.box_seen: merge, Router.observe; per box per "
        "poll); serve ms = the box's snapshot + JSON; shell ms = the box's own "
        "RouterShell.observe of one instance's telemetry delta (the same in every mode)"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
