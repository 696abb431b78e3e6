"""KV layout descriptions and the byte geometry of a paged KV pool (pure, no torch).

A page row is the KV of `page_size` tokens across every layer and component (K and V for MHA,
the latent for MLA, the recurrent state for Mamba-style layers). The pool is either
layer-first ([component, layer, page, fragment], what attention kernels read) or page-first
([page, component, layer, fragment]); App. C. Every copy the substrate issues is described by a
`ViewSpec`: a 2-D strided byte view whose bytes, read row by row, form one contiguous span.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_BYTES = {
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "float32": 4,
    "int32": 4,
    "float64": 8,
    "int64": 8,
}
FAMILY_COMPONENTS = {"mha": ("k", "v"), "mla": ("latent",), "mamba": ("state",)}
ORDERS = ("layer_first", "page_first")


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Per-model KV description; for `mla` num_kv_heads is 1 and head_dim is the latent width,
    for `mamba` a page is one sequence state slot of `state_bytes` per layer."""

    num_layers: int
    num_kv_heads: int = 1
    head_dim: int = 1
    page_size: int = 16
    dtype: str = "bfloat16"
    family: str = "mha"
    order: str = "layer_first"
    state_bytes: int = 0
    fragment_bytes: int = field(init=False, repr=False, compare=False)
    """Bytes of one component of one layer of one page (derived)."""

    def __post_init__(self) -> None:
        if self.family not in FAMILY_COMPONENTS:
            raise ValueError(f"family={self.family!r} must be one of {sorted(FAMILY_COMPONENTS)}")
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r} must be one of {ORDERS}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.family == "mamba" and self.state_bytes < 1:
            raise ValueError("state_bytes must be >= 1 for family='mamba'")
        frag = (
            self.state_bytes
            if self.family == "mamba"
            else (self.page_size * self.num_kv_heads * self.head_dim * dtype_bytes(self.dtype))
        )
        object.__setattr__(self, "fragment_bytes", frag)  # hot in every copy plan: compute once

    @property
    def components(self) -> tuple[str, ...]:
        return FAMILY_COMPONENTS[self.family]

    @property
    def component_bytes(self) -> int:
        return self.num_layers * self.fragment_bytes

    @property
    def row_bytes(self) -> int:
        """Bytes of one page row across all layers and components."""
        return len(self.components) * self.component_bytes

    @property
    def fragment_shape(self) -> tuple[int, ...]:
        if self.family == "mamba":
            return (self.state_bytes // dtype_bytes(self.dtype),)
        return (self.page_size, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True, slots=True)
class ViewSpec:
    """A strided 2-D byte view at `offset`: `rows` rows of `width` bytes, `stride` bytes apart."""

    offset: int
    rows: int
    width: int
    stride: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.width

    @property
    def lo(self) -> int:
        return self.offset

    @property
    def hi(self) -> int:
        return self.offset + (self.rows - 1) * self.stride + self.width


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Where a layout's pages live inside the pool region [offset, offset + nbytes) of the buffer."""

    layout: KVLayout
    offset: int
    nbytes: int
    num_pages: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_pages", self.nbytes // self.layout.row_bytes)

    @property
    def used_bytes(self) -> int:
        return self.num_pages * self.layout.row_bytes

    def _block(self, comp: int, layer: int) -> int:
        return comp * self.layout.num_layers + layer

    def fragment_offset(self, page: int, comp: int, layer: int) -> int:
        lay, f = self.layout, self.layout.fragment_bytes
        if lay.order == "layer_first":
            return self.offset + (self._block(comp, layer) * self.num_pages + page) * f
        return self.offset + page * lay.row_bytes + self._block(comp, layer) * f

    def layer_spec(self, comp: int, layer: int) -> ViewSpec:
        """All pages of one (component, layer): the tensor an attention kernel reads."""
        f = self.layout.fragment_bytes
        stride = f if self.layout.order == "layer_first" else self.layout.row_bytes
        return ViewSpec(self.fragment_offset(0, comp, layer), self.num_pages, f, stride)

    def layers_spec(self, page: int, comp: int, first: int, count: int) -> ViewSpec:
        """Layers [first, first+count) of one component of one page."""
        f = self.layout.fragment_bytes
        stride = self.num_pages * f if self.layout.order == "layer_first" else f
        return ViewSpec(self.fragment_offset(page, comp, first), count, f, stride)

    def rows_specs(self, first_row: int, num_rows: int) -> list[ViewSpec]:
        """Page rows [first_row, first_row+num_rows) as views whose concatenation is the rows' bytes."""
        lay = self.layout
        if lay.order == "page_first":
            return [
                ViewSpec(self.offset + first_row * lay.row_bytes, 1, num_rows * lay.row_bytes, 0)
            ]
        blocks = len(lay.components) * lay.num_layers
        seg = num_rows * lay.fragment_bytes
        return [
            ViewSpec(
                self.fragment_offset(first_row, 0, 0),
                blocks,
                seg,
                self.num_pages * lay.fragment_bytes,
            )
        ]

    def rows_low_address(self, first_row: int) -> int:
        return self.fragment_offset(first_row, 0, 0)


def split_spec(spec: ViewSpec, nbytes: int) -> list[ViewSpec]:
    """The leading `nbytes` of a view's logical byte stream, as at most two views."""
    full, rem = divmod(min(nbytes, spec.nbytes), spec.width)
    out = [ViewSpec(spec.offset, full, spec.width, spec.stride)] if full else []
    if rem:
        out.append(ViewSpec(spec.offset + full * spec.stride, 1, rem, spec.width))
    return out


def take_bytes(specs: list[ViewSpec], nbytes: int) -> list[ViewSpec]:
    out: list[ViewSpec] = []
    for spec in specs:
        if nbytes <= 0:
            break
        out += split_spec(spec, nbytes)
        nbytes -= spec.nbytes
    return out
