"""Front-path overhead: talariad in front of a zero-cost sim instance against a minimal instant
OpenAI-shaped server, driven by the same load generator in one run.

Run: .venv/bin/python bench/front_bench.py [--seconds 3] [--conns 1,32] [--stream-calls 200]

(a) `direct`: a minimal aiohttp OpenAI-shaped server (the issue's baseline) that parses each chat
    completion and answers at once (a one-token JSON body, or a one-chunk SSE stream), in its own
    process;
(b) `talariad`: the daemon with one hot `sim` instance whose model uses the bundled zero-cost
    latency profile (`profile: instant`), so a call costs only the gateway, router and hop.
Load: `wrk` with a Lua body when it is installed (Debian package `wrk`), else a built-in asyncio
keep-alive client; each concurrency runs for `--seconds` on kept-alive connections. Streaming:
time to the first SSE `data:` chunk on one kept-alive connection, sequential calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "instant"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "say one word"}], "max_tokens": 1}
CONFIG = """\
listen:
  http: 127.0.0.1:{port}
  admin_socket: {admin}
models:
  - name: {model}
    profile: instant
instances:
  - name: hot0
    pool: hot
    executor: sim
    models: [{model}]
"""


# ---- (a) the instant server ---------------------------------------------------------------------


def _completion(model: str) -> dict:
    return {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def _chunk(model: str) -> str:
    delta = {"index": 0, "delta": {"content": "ok"}, "finish_reason": "length"}
    return json.dumps(
        {
            "id": "chatcmpl-0",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [delta],
        }
    )


def serve_instant(port_file: str) -> None:
    """A minimal aiohttp OpenAI-shaped server that answers every chat completion at once: it
    parses the JSON body and answers a one-token completion (JSON, or a one-chunk SSE stream)."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(_completion(body["model"]))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"data: {_chunk(body['model'])}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock, backlog=512)
        await site.start()
        Path(port_file).write_text(str(sock.getsockname()[1]))
        await asyncio.Event().wait()

    asyncio.run(main())


# ---- load generators ----------------------------------------------------------------------------


def _request(port: int, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data


async def _read_response(reader: asyncio.StreamReader, on_data=None) -> None:
    """Read one HTTP/1.1 response (content-length or chunked); call on_data at the first `data:`."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad response: {head[:80]!r}")
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    if m:
        await reader.readexactly(int(m.group(1)))
        return
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if on_data is not None and b"data:" in chunk:
            on_data()
            on_data = None
        if size == 0:
            return


async def _client_load(port: int, conns: int, seconds: float) -> tuple[list[float], float]:
    req, lat = _request(port, BODY), []

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            writer.write(req)
            await _read_response(reader)
            lat.append(time.perf_counter() - t0)
        writer.close()

    stop = time.perf_counter() + seconds
    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(conns)))
    return lat, len(lat) / (time.perf_counter() - t0)


_WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _wrk(port: int, conns: int, seconds: float, script: str) -> dict:
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            script,
            f"http://127.0.0.1:{port}/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ms = {
        q: float(v) * _WRK_UNITS[u]
        for q, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    }
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad:
        raise RuntimeError(f"wrk saw {bad.group(1)} error responses:\n{out}")
    return {
        "p50_ms": ms["50"],
        "p99_ms": ms["99"],
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
    }


def _pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load(port: int, conns: int, seconds: float, script: str | None) -> dict:
    if script:
        return _wrk(port, conns, seconds, script)
    lat, rps = asyncio.run(_client_load(port, conns, seconds))
    return {"p50_ms": _pct(lat, 0.5) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3, "rps": rps}


async def _first_chunk(port: int, calls: int) -> list[float]:
    """Seconds from sending a streaming call to its first SSE data chunk, on one kept-alive connection."""
    req = _request(port, {**BODY, "stream": True, "max_tokens": 4})
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: list[float] = []
    for _ in range(calls):
        t0 = time.perf_counter()
        writer.write(req)
        await _read_response(reader, lambda t0=t0: out.append(time.perf_counter() - t0))
    writer.close()
    return out


# ---- processes ----------------------------------------------------------------------------------


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("server did not start")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_direct(tmp: Path) -> tuple[subprocess.Popen, int]:
    port_file = tmp / "instant.port"
    proc = subprocess.Popen([sys.executable, __file__, "--serve-instant", str(port_file)])
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("instant server did not start")
        time.sleep(0.02)
    port = int(port_file.read_text())
    _wait_port(port, proc)
    return proc, port


def start_talariad(tmp: Path, extra: str = "") -> tuple[subprocess.Popen, int]:
    """`extra`: more top-level YAML for the config (e.g. a `policy:` block)."""
    port = _free_port()
    cfg = tmp / "talaria.yaml"
    cfg.write_text(CONFIG.format(port=port, admin=tmp / "admin.sock", model=MODEL) + extra)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "talariad.cli",
            "run",
            "--config",
            str(cfg),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:  # the daemon prints one line once every instance is ready
        if "listening on" in line:
            break
    else:
        raise RuntimeError(f"talariad exited with {proc.wait()}")
    _wait_port(port, proc)
    return proc, port


def _tree(proc: subprocess.Popen) -> list:
    """The process and its children (talariad: the gateway, then its instance processes)."""
    import psutil

    root = psutil.Process(proc.pid)
    return [root] + root.children(recursive=True)


def _cpu_s(procs: list) -> list[float]:
    """User + system CPU seconds of each process so far."""
    import psutil

    out = []
    for p in procs:
        t = (p if isinstance(p, psutil.Process) else psutil.Process(p.pid)).cpu_times()
        out.append(t.user + t.system)
    return out


def _report(rows: dict, cpu: dict, ttfc: dict, stream_calls: int) -> None:
    print(
        f"{'conns':>5} {'server':<9} {'p50 ms':>8} {'p99 ms':>8} {'rps':>9}  "
        "CPU ms per call (talariad: gateway + instance)"
    )
    for (name, c), r in rows.items():
        per = " + ".join(f"{x * 1e3:.3f}" for x in cpu[(name, c)])
        print(f"{c:>5} {name:<9} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['rps']:9.0f}  {per}")
    for c in sorted({c for _, c in rows}):
        d, t = rows[("direct", c)], rows[("talariad", c)]
        print(
            f"c={c}: talariad adds p50 {t['p50_ms'] - d['p50_ms']:.3f} ms, p99 {t['p99_ms'] - d['p99_ms']:.3f} ms; "
            f"throughput {t['rps'] / d['rps']:.2f}x direct"
        )
    d50, t50 = _pct(ttfc["direct"], 0.5) * 1e3, _pct(ttfc["talariad"], 0.5) * 1e3
    d99, t99 = _pct(ttfc["direct"], 0.99) * 1e3, _pct(ttfc["talariad"], 0.99) * 1e3
    print(
        f"streaming, time to first chunk over {stream_calls} calls: direct p50 {d50:.3f} ms p99 {d99:.3f} ms; "
        f"talariad p50 {t50:.3f} ms p99 {t99:.3f} ms; added p50 {t50 - d50:.3f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--conns", default="1,32")
    ap.add_argument("--stream-calls", type=int, default=200)
    ap.add_argument("--client", choices=("auto", "wrk", "asyncio"), default="auto")
    ap.add_argument("--serve-instant", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_instant:
        return serve_instant(args.serve_instant)
    use_wrk = args.client == "wrk" or (args.client == "auto" and shutil.which("wrk") is not None)
    print(
        f"front path: load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
        f"load generator {'wrk (Lua body)' if use_wrk else 'asyncio keep-alive client'}; "
        f"{args.seconds:g} s per run, keep-alive"
    )
    with tempfile.TemporaryDirectory(prefix="talaria-front-") as d:
        tmp = Path(d)
        script = None
        if use_wrk:
            script = str(tmp / "post.lua")
            Path(script).write_text(
                f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(BODY))}\n'
                'wrk.headers["Content-Type"] = "application/json"\n'
            )
        procs = []
        try:
            direct, dport = start_direct(tmp)
            procs.append(direct)
            daemon, tport = start_talariad(tmp)
            procs.append(daemon)
            rows, cpu = {}, {}
            servers = {"direct": [direct], "talariad": _tree(daemon)}
            for c in (int(x) for x in args.conns.split(",")):
                for name, port in (("direct", dport), ("talariad", tport)):
                    load(port, c, min(1.0, args.seconds), script)  # warm-up
                    before = _cpu_s(servers[name])
                    rows[(name, c)] = load(port, c, args.seconds, script)
                    spent = [b - a for a, b in zip(before, _cpu_s(servers[name]), strict=False)]
                    cpu[(name, c)] = [s / (rows[(name, c)]["rps"] * args.seconds) for s in spent]
            ttfc = {
                name: asyncio.run(_first_chunk(port, args.stream_calls))
                for name, port in (("direct", dport), ("talariad", tport))
            }
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
    _report(rows, cpu, ttfc, args.stream_calls)
    print("goals: added p50 <= 0.5 ms at c=1; c=32 throughput >= 0.5x direct")


if __name__ == "__main__":
    main()
