"""The one interface through which the substrate moves bytes (no torch here).

Buffers are flat byte buffers; `view` turns a byte range into a typed, possibly strided tensor.
Copies are asynchronous on a device and return an `CopyEvent`; on the CPU they complete at once.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CopyEvent(Protocol):
    def query(self) -> bool:
        """True once the copy has completed (never blocks)."""

    def synchronize(self) -> None:
        """Block until the copy has completed."""


class Device(Protocol):
    name: str

    def alloc(self, nbytes: int) -> Any:
        """A device byte buffer."""

    def alloc_host(self, nbytes: int) -> Any:
        """A host byte buffer, page-locked where the device can DMA from it."""

    def view(
        self,
        buf: Any,
        offset: int,
        shape: tuple[int, ...],
        dtype: str = "uint8",
        strides: tuple[int, ...] | None = None,
    ) -> Any:
        """A typed view of `buf` starting `offset` bytes in; `strides` in elements (None: contiguous)."""

    def copy_h2d(self, dst: Any, src: Any) -> CopyEvent: ...

    def copy_d2h(self, dst: Any, src: Any) -> CopyEvent: ...

    def copy_d2d(self, dst: Any, src: Any) -> CopyEvent: ...

    def address(self, buf: Any) -> int:
        """The base address of a buffer or view (what captured graphs hold on to)."""

    def synchronize(self) -> None: ...
