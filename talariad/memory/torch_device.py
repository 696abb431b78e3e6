"""`Device` over torch: CPU tensors (tests, the embedded default) or CUDA with pinned host memory,
one stream per copy direction, and CUDA events. The only module of the substrate importing torch."""

from __future__ import annotations

import torch

from talariad.memory.kv_layout import contiguous_strides

TORCH_DTYPES = {
    "uint8": torch.uint8,
    "int8": torch.int8,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int16": torch.int16,
    "float32": torch.float32,
    "int32": torch.int32,
    "float64": torch.float64,
    "int64": torch.int64,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


class CompletedCopy:
    """A copy that completed when it was issued (the CPU path)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


DONE = CompletedCopy()


def torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(TORCH_DTYPES)}")
    return TORCH_DTYPES[dtype]


class TorchDevice:
    def __init__(self, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.name = str(self.device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda:
            self._streams = {k: torch.cuda.Stream(self.device) for k in ("h2d", "d2h", "d2d")}

    # CUDA memory and pinned host memory are committed when allocated; plain CPU pages only when
    # first written. Zeroing them commits the footprint at start, as on a GPU, so a process does
    # not grow into its buffers over hours and an arena too large fails at start-up.
    def alloc(self, nbytes: int) -> torch.Tensor:
        if self.is_cuda:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return torch.zeros(nbytes, dtype=torch.uint8)

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        if self.is_cuda:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return torch.zeros(nbytes, dtype=torch.uint8)

    def view(
        self,
        buf: torch.Tensor,
        offset: int,
        shape: tuple[int, ...],
        dtype: str = "uint8",
        strides: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        t = torch_dtype(dtype)
        item = t.itemsize
        if offset % item:
            raise ValueError(f"offset={offset} is not aligned to {dtype} ({item} bytes)")
        typed = buf if item == 1 else buf[: buf.numel() // item * item].view(t)
        strides = contiguous_strides(shape) if strides is None else strides
        return typed.as_strided(shape, strides, typed.storage_offset() + offset // item)

    def _copy(self, kind: str, dst: torch.Tensor, src: torch.Tensor):
        if not self.is_cuda:
            dst.copy_(src)
            return DONE
        stream = self._streams[kind]
        # The copy must see everything the compute stream wrote before it was issued.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def copy_h2d(self, dst: torch.Tensor, src: torch.Tensor):
        return self._copy("h2d", dst, src)

    def copy_d2h(self, dst: torch.Tensor, src: torch.Tensor):
        return self._copy("d2h", dst, src)

    def copy_d2d(self, dst: torch.Tensor, src: torch.Tensor):
        return self._copy("d2d", dst, src)

    def address(self, buf: torch.Tensor) -> int:
        return buf.data_ptr()

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
