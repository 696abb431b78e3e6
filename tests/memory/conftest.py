"""Factories for memory tests: substrates over the CPU (or CUDA) torch device and a deferred device
whose copies only happen when the test (or a synchronize) lets them."""

from __future__ import annotations

import pytest
import torch

from talariad.memory import KVLayout, Substrate, SubstrateConfig
from talariad.memory.torch_device import TorchDevice

CUDA_REASON = "no CUDA device: torch.cuda.is_available() is False"

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA_REASON),
        ],
    ),
]


class DeferredEvent:
    def __init__(self, dev: DeferredDevice, seq: int) -> None:
        self.dev, self.seq = dev, seq

    def query(self) -> bool:
        return self.dev.done >= self.seq

    def synchronize(self) -> None:
        self.dev.run_until(self.seq)


class DeferredDevice(TorchDevice):
    """Copies are queued in issue order (one stream) and read their source only when they run."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(device)
        self.queue: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.issued = 0
        self.done = 0

    def _copy(self, kind, dst, src):
        self.issued += 1
        self.queue.append((self.issued, dst, src))
        return DeferredEvent(self, self.issued)

    def run_until(self, seq: int) -> None:
        while self.queue and self.queue[0][0] <= seq:
            n, dst, src = self.queue.pop(0)
            dst.copy_(src)
            self.done = n

    def advance(self, n: int) -> None:
        self.run_until(self.done + n)

    def synchronize(self) -> None:
        self.run_until(self.issued)


def small_config(**kw) -> SubstrateConfig:
    base = dict(
        capacity_bytes=4 << 20,
        host_kv_bytes=1 << 20,
        runtime_bytes=64 << 10,
        graph_pool_bytes=32 << 10,
        slab_bytes=8 << 10,
        chunk_bytes=32 << 10,
    )
    base.update(kw)
    return SubstrateConfig(**base)


MHA = KVLayout(num_layers=4, num_kv_heads=2, head_dim=8, page_size=4, dtype="float16")


def model_shapes(n: int, dtype: str = "float32") -> dict:
    return {"embed": ((n, 64), dtype), "norm": ((64,), dtype), "head": ((n // 2, 64), dtype)}


def fill_random(views: dict, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for v in views.values():
        v.copy_(
            torch.randint(0, 256, (v.numel() * v.element_size(),), generator=gen, dtype=torch.uint8)
            .view(v.dtype)
            .view(v.shape)
        )


def make_substrate(
    device=None, config: SubstrateConfig | None = None, models: dict | None = None, **kw
) -> Substrate:
    """A substrate with models registered and their host images filled with random bytes."""
    sub = Substrate(device or TorchDevice("cpu"), config or small_config(), **kw)
    for i, (name, (shapes, layout)) in enumerate(
        (models or {"a": (model_shapes(512), MHA)}).items()
    ):
        fill_random(sub.register_model(name, shapes, layout), seed=i)
    return sub


def fill_pages(sub: Substrate, pages: list[int], seed: int) -> None:
    """Write random bytes into every fragment of the given pages (a stand-in for prefill)."""
    gen = torch.Generator().manual_seed(seed)
    lay = sub.geometry.layout
    for c in range(len(lay.components)):
        for layer in range(lay.num_layers):
            cache = sub.kv_cache(c, layer)
            for p in pages:
                raw = torch.randint(0, 256, (lay.fragment_bytes,), generator=gen, dtype=torch.uint8)
                cache[p].copy_(raw.view(cache.dtype).view(cache[p].shape))


def page_bytes(sub: Substrate, pages: list[int]) -> list[bytes]:
    lay = sub.geometry.layout
    return [
        b"".join(
            sub.kv_cache(c, layer)[p].contiguous().view(torch.uint8).cpu().numpy().tobytes()
            for c in range(len(lay.components))
            for layer in range(lay.num_layers)
        )
        for p in pages
    ]


def weights_match_host(sub: Substrate, name: str) -> bool:
    live, host = sub.weights_view(name), sub.host_weights(name)
    return all(
        torch.equal(live[k].cpu().view(torch.uint8), host[k].view(torch.uint8)) for k in host
    )
