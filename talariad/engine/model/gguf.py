"""GGUF, llama.cpp's single-file checkpoint format: the header, the metadata and the tensors.

`GGUFFile(path)` parses the header, the metadata and the tensor descriptors with `struct` and
memory-maps the tensor data; `tensor(name)` dequantizes one tensor to a float32 numpy array.
Supported tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K (llama.cpp's
ggml-quants.c is the reference for each block layout). Anything else is refused, naming it.
What a GGUF means as a model (architecture, names, tokenizer) is in gguf_model.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
QK_K = 256  # elements in one K-quant super-block

# metadata value types (gguf.h enum gguf_type)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class GGMLType:
    name: str
    block: int  # elements per block
    nbytes: int  # bytes per block


GGML_TYPES = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 18),
    3: GGMLType("Q4_1", 32, 20),
    8: GGMLType("Q8_0", 32, 34),
    12: GGMLType("Q4_K", QK_K, 144),
    14: GGMLType("Q6_K", QK_K, 210),
    30: GGMLType("BF16", 1, 2),
}
"""The tensor types this reader dequantizes, by ggml type id."""

GGML_TYPE_NAMES = {
    6: "Q5_0",
    7: "Q5_1",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    13: "Q5_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    29: "IQ1_M",
    34: "TQ1_0",
    35: "TQ2_0",
}
"""Known ggml types that are not supported, for a readable refusal."""


def type_name(ttype: int) -> str:
    if ttype in GGML_TYPES:
        return GGML_TYPES[ttype].name
    return GGML_TYPE_NAMES.get(ttype, f"type {ttype}")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy/torch order (the file lists dimensions innermost first)
    ttype: int
    offset: int  # from the start of the data section

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def scalar(self, fmt: str) -> Any:
        try:
            (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise ValueError(f"{self.path.name}: truncated GGUF header") from None
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            itype, n = self.scalar("<I"), self.scalar("<Q")
            if itype in _SCALARS and itype != 7:  # a numeric array in one read
                dt = np.dtype(_SCALARS[itype])
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos += n * dt.itemsize
                return arr.tolist()
            return [self.value(itype) for _ in range(n)]
        raise ValueError(f"{self.path.name}: unknown GGUF metadata type {vtype}")


class GGUFFile:
    """The metadata (a dict) and tensor descriptors of a .gguf file; the data is memory-mapped."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"GGUF file not found: {self.path}")
        self.data = np.memmap(self.path, dtype=np.uint8, mode="r")
        if bytes(self.data[:4]) != MAGIC:
            raise ValueError(f"{self.path.name} is not a GGUF file (no GGUF magic)")
        cur = _Cursor(memoryview(self.data), self.path)
        cur.pos = 4
        self.version = cur.scalar("<I")
        if self.version not in VERSIONS:
            raise ValueError(f"{self.path.name}: GGUF version {self.version} is not supported")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))
        self.tensors: dict[str, TensorInfo] = {}
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
            ttype, offset = cur.scalar("<I"), cur.scalar("<Q")
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), ttype, offset)
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = -(-cur.pos // align) * align

    def unsupported_types(self) -> dict[str, str]:
        """Tensor name -> type name, for every tensor of a type this reader cannot dequantize."""
        return {n: type_name(t.ttype) for n, t in self.tensors.items() if t.ttype not in GGML_TYPES}

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as float32, in numpy/torch order (rows, cols)."""
        info = self.tensors[name]
        kind = GGML_TYPES.get(info.ttype)
        if kind is None:
            raise ValueError(f"{self.path.name}: {name}: {type_name(info.ttype)} is not supported")
        if info.count % kind.block:
            raise ValueError(f"{self.path.name}: {name}: {info.count} elements, not whole blocks")
        start = self.data_start + info.offset
        raw = self.data[start : start + info.count // kind.block * kind.nbytes]
        return dequantize(np.asarray(raw), info.ttype).reshape(info.shape)


def dequantize(raw: np.ndarray, ttype: int) -> np.ndarray:
    """The float32 values of `raw` (uint8 bytes of whole blocks of ggml type `ttype`), flat."""
    kind = GGML_TYPES[ttype]
    if kind.name == "F32":
        return raw.view(np.float32).copy()
    if kind.name == "F16":
        return raw.view(np.float16).astype(np.float32)
    if kind.name == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    blocks = raw.reshape(-1, kind.nbytes)
    return _BLOCK_DEQUANT[kind.name](blocks).reshape(-1)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles of a block's bytes, then its high nibbles (ggml's 4-bit order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


def _q8_0(b: np.ndarray) -> np.ndarray:  # d f16, q int8[32]: x = d * q
    return _f16(b[:, :2]) * np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:  # d f16, qs u8[16]: x = d * (q - 8)
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]) - 8.0)


def _q4_1(b: np.ndarray) -> np.ndarray:  # d f16, m f16, qs u8[16]: x = d * q + m
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]) + _f16(b[:, 2:4])


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 8 six-bit (scale, min) pairs packed in 12 bytes (get_scale_min_k4)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    # d f16, dmin f16, scales u8[12], qs u8[128]: 8 sub-blocks of 32, x = d*sc*q - dmin*m;
    # each 32 bytes of qs hold two sub-blocks (low nibbles, then high nibbles)
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, 8, 32).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(n, QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    # ql u8[128] (low 4 bits), qh u8[64] (high 2 bits), scales i8[16], d f16: x = d*sc*(q - 32)
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    lo = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    lo = (lo & 0x0F).reshape(n, 8, 32)
    hi = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    hi = (hi & 0x03).reshape(n, 8, 32)
    q = (lo | (hi << 4)).astype(np.float32) - 32.0
    return ((d * scales)[:, :, None] * q.reshape(n, 16, 16)).reshape(n, QK_K)


_BLOCK_DEQUANT = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k, "Q6_K": _q6_k}
