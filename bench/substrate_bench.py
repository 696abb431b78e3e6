"""Memory-substrate benchmark: HKVR save/restore throughput against a plain tensor copy of the same
bytes, and model-switch time by full D2D, half-staged (partial) and H2D opens.

    python bench/substrate_bench.py [--device cpu|cuda] [--model-gb 1.0] [--kv-mb 512] [--repeat 3]
                                    [--threads 1]

On a CPU-only machine "device" and "host" are both DRAM, so D2D and H2D cost about the same; the
paper's ~4% full-D2D/H2D ratio comes from HBM vs PCIe bandwidth and needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from talariad.memory import KVLayout, Substrate, SubstrateConfig, prefix_hashes
from talariad.memory.torch_device import TorchDevice

MB = 1 << 20


def timed(fn, dev: TorchDevice) -> float:
    dev.synchronize()
    t0 = time.perf_counter()
    fn()
    dev.synchronize()
    return time.perf_counter() - t0


def llama_layout(order: str) -> KVLayout:
    return KVLayout(
        num_layers=32, num_kv_heads=8, head_dim=128, page_size=16, dtype="bfloat16", order=order
    )


def bench_hkvr(device: str, kv_mb: int, repeat: int, order: str) -> list[float]:
    dev, lay = TorchDevice(device), llama_layout(order)
    pages_n = kv_mb * MB // lay.row_bytes
    cfg = SubstrateConfig(
        capacity_bytes=(kv_mb + 64) * MB + 16 * MB,
        host_kv_bytes=(kv_mb + 8) * MB,
        runtime_bytes=4 * MB,
        graph_pool_bytes=4 * MB,
        slab_bytes=lay.component_bytes,
    )
    sub = Substrate(dev, cfg)
    sub.register_model("m", {"w": ((MB,), "uint8")}, lay)
    sub.switch_to("m", 0.0)
    sub.buffer.fill_(7)  # touch every page: untouched memory reads as the shared zero page
    sub.host_kv.host.fill_(0)
    nbytes = pages_n * lay.row_bytes
    src, dst = sub.device.view(sub.buffer, sub.geometry.offset, (nbytes,)), dev.alloc_host(nbytes)
    dst.fill_(0)
    plain_save = [timed(lambda: dev.copy_d2h(dst, src), dev) for _ in range(repeat)]
    plain_load = [timed(lambda: dev.copy_h2d(src, dst), dev) for _ in range(repeat)]
    saves, loads = [], []
    for r in range(repeat):
        sub.allocate_pages("s", pages_n)
        hashes = prefix_hashes(list(range(pages_n * lay.page_size)), lay.page_size, model=f"run{r}")
        saves.append(
            timed(lambda h=hashes: (sub.checkpoint("s", h, 0.0), sub.host_kv.drain("m")), dev)
        )
        sub.free_session("s")
        loads.append(timed(lambda h=hashes: (sub.restore("s", h, 0.0), sub.wait_restore("s")), dev))
        sub.free_session("s")
        for block in list(sub.registry.blocks.values()):
            sub.registry.evict(block)
    gbps = lambda t: nbytes / statistics.median(t) / 1e9  # noqa: E731
    print(f"HKVR [{order}] {nbytes / MB:.0f} MiB, {pages_n} pages of {lay.row_bytes // 1024} KiB:")
    print(
        f"  save    {gbps(saves):6.2f} GB/s  plain copy {gbps(plain_save):6.2f} GB/s  "
        f"ratio {gbps(saves) / gbps(plain_save):.2f}"
    )
    print(
        f"  restore {gbps(loads):6.2f} GB/s  plain copy {gbps(plain_load):6.2f} GB/s  "
        f"ratio {gbps(loads) / gbps(plain_load):.2f}"
    )
    return [gbps(saves) / gbps(plain_save), gbps(loads) / gbps(plain_load)]


def bench_switch(device: str, model_gb: float, repeat: int) -> None:
    dev, lay = TorchDevice(device), llama_layout("layer_first")
    tensor_mb = 64
    n_tensors = max(1, int(model_gb * 1024 / tensor_mb))
    shapes = {f"layer{i}.w": ((tensor_mb * MB // 2,), "bfloat16") for i in range(n_tensors)}
    model_bytes = n_tensors * tensor_mb * MB
    cfg = SubstrateConfig(
        capacity_bytes=2 * model_bytes + 256 * MB,
        host_kv_bytes=8 * MB,
        runtime_bytes=16 * MB,
        graph_pool_bytes=16 * MB,
        chunk_bytes=64 * MB,
    )
    sub = Substrate(dev, cfg)
    sub.buffer.fill_(0)
    for i, name in enumerate(("a", "b")):
        for v in sub.register_model(name, shapes, lay).values():
            v.view(torch.int16).fill_(i + 1)
    sub.switch_to("a", 0.0)
    results: dict[str, list] = {"d2d": [], "partial": [], "h2d": []}
    for _ in range(repeat):
        for kind, other in (("d2d", "b"), ("partial", "a"), ("h2d", "b")):
            if kind != "h2d" and sub.stage(other, 0.0):
                chunks = len(sub.staging.chunks)
                sub.stage_step(0.0, chunks if kind == "d2d" else chunks // 2)
                sub.poll()
            results[kind].append(sub.switch_to(other, 0.0))
            if kind == "h2d":
                sub.switch_to("a", 0.0)  # back to the start for the next round
    h2d = statistics.median(r.phase_s[1] for r in results["h2d"])
    h2d_total = statistics.median(r.total_s for r in results["h2d"])
    print(
        f"Switch, model {model_bytes / 2**30:.2f} GiB ({n_tensors} x {tensor_mb} MiB), chunks 64 MiB, device={device}:"
    )
    for kind, recs in results.items():
        p2 = statistics.median(r.phase_s[1] for r in recs)
        total = statistics.median(r.total_s for r in recs)
        paths = sorted({r.path.value for r in recs})
        staged = statistics.median(r.staged_bytes for r in recs) / model_bytes
        print(
            f"  {kind:8s} path={','.join(paths):8s} staged={staged:4.0%}  open(P2) {p2 * 1e3:7.1f} ms "
            f"({p2 / h2d:.2f} of H2D)  total {total * 1e3:7.1f} ms ({total / h2d_total:.2f} of H2D)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model-gb", type=float, default=1.0)
    ap.add_argument("--kv-mb", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (on a small shared CPU, waking the pool for every "
        "MB-sized copy costs more than the copy; 0 keeps torch's default)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    ratios = [
        r
        for order in ("layer_first", "page_first")
        for r in bench_hkvr(args.device, args.kv_mb, args.repeat, order)
    ]
    print(
        f"goal HKVR save and restore >= 0.8 of a plain copy in both layouts: "
        f"{'met' if min(ratios) >= 0.8 else 'not met'} (lowest {min(ratios):.2f})"
    )
    bench_switch(args.device, args.model_gb, args.repeat)


if __name__ == "__main__":
    main()
