"""The bump-managed layout of one device buffer (§4.2, Figure 5; pure bookkeeping).

Weights grow up from offset 0, runtime regions (runtime buffers, graph pool, ...) are stacked
down from the high end, and the KV pool is the gap between them. Offsets only: the substrate maps
them onto a real buffer through the device interface.
"""

from __future__ import annotations

from dataclasses import dataclass


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass(frozen=True, slots=True)
class Region:
    """One dashboard row: a named byte range of the buffer and who owns it."""

    name: str
    offset: int
    size: int
    owner: str

    @property
    def end(self) -> int:
        return self.offset + self.size


class BumpLayout:
    def __init__(self, capacity: int, alignment: int = 256) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity={capacity} must be > 0")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment={alignment} must be a power of two")
        self.capacity = capacity
        self.alignment = alignment
        self.weights = Region("weights", 0, 0, "")
        self._high: list[tuple[str, int, str]] = []  # (name, size, owner), top first
        self.kv_owner = ""

    # ---- high-end regions -------------------------------------------------------------
    def high_regions(self) -> list[Region]:
        out, top = [], self.capacity
        for name, size, owner in self._high:
            top -= size
            out.append(Region(name, top, size, owner))
        return out

    def high_floor(self) -> int:
        return self.capacity - sum(size for _, size, _ in self._high)

    def can_reserve_high(self, size: int) -> bool:
        return self.high_floor() - align_up(size, self.alignment) >= self.weights.end

    def reserve_high(self, name: str, size: int, owner: str = "runtime") -> Region | None:
        """Stack a region below the existing high regions; None when it would cross the weights."""
        if any(n == name for n, _, _ in self._high) or not self.can_reserve_high(size):
            return None
        self._high.append((name, align_up(size, self.alignment), owner))
        return self.region(name)

    def resize_high(self, name: str, size: int) -> Region | None:
        """Resize a high region in place; lower regions move (their captured pointers go stale)."""
        idx = next((i for i, (n, _, _) in enumerate(self._high) if n == name), None)
        if idx is None:
            return None
        old = self._high[idx]
        self._high[idx] = (name, align_up(size, self.alignment), old[2])
        if self.high_floor() < self.weights.end:
            self._high[idx] = old
            return None
        return self.region(name)

    # ---- weights and KV pool ------------------------------------------------------------
    def can_resize_weights(self, size: int) -> bool:
        return align_up(size, self.alignment) <= self.high_floor()

    def resize_weights(self, model: str, size: int) -> Region | None:
        """Give the weight region to `model`; the KV pool becomes whatever gap is left."""
        if not self.can_resize_weights(size):
            return None
        self.weights = Region("weights", 0, align_up(size, self.alignment), model)
        self.kv_owner = model
        return self.weights

    @property
    def kv_pool(self) -> Region:
        lo = self.weights.end
        return Region("kv_pool", lo, self.high_floor() - lo, self.kv_owner)

    def region(self, name: str) -> Region | None:
        return next((r for r in self.regions() if r.name == name), None)

    def regions(self) -> list[Region]:
        return [self.weights, self.kv_pool, *reversed(self.high_regions())]

    def base_addresses(self) -> dict[str, int]:
        return {r.name: r.offset for r in self.regions()}

    def report(self, inner: list[Region] = ()) -> list[tuple[str, int, int, str]]:
        """(region, offset, size, owner) rows, low address first; `inner` are sub-regions of the KV
        pool such as staged chunks."""
        rows = [*self.regions(), *inner]
        return [
            (r.name, r.offset, r.size, r.owner)
            for r in sorted(rows, key=lambda r: (r.offset, -r.size))
        ]

    def check_integrity(self, inner: list[Region] = ()) -> None:
        regions = self.regions()
        if sum(r.size for r in regions) != self.capacity:
            raise AssertionError(
                f"regions sum to {sum(r.size for r in regions)} != {self.capacity}"
            )
        for a, b in zip(regions, regions[1:], strict=False):
            if a.end != b.offset or a.size < 0:
                raise AssertionError(f"regions {a} and {b} overlap or leave a hole")
        pool = self.kv_pool
        for r in inner:
            if r.offset < pool.offset or r.end > pool.end:
                raise AssertionError(f"{r} lies outside the KV pool {pool}")
