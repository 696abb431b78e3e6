"""ArchConfig: the architecture of a Llama/Qwen2-family decoder, read from a HF config.json."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass(frozen=True, slots=True)
class ArchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    qkv_bias: bool = False
    """Bias on q/k/v projections (always on for qwen2; llama's `attention_bias`)."""
    o_bias: bool = False
    """Bias on the output projection (llama's `attention_bias` only)."""
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    """None, or a llama3-style frequency scaling dict."""
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in (*_REQUIRED, "num_key_value_heads", "head_dim", "max_position_embeddings"):
            _check_positive_int(name, getattr(self, name))
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r}: supported are {SUPPORTED_MODEL_TYPES}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"{self.rms_norm_eps=} and {self.rope_theta=} must be > 0")
        _check_rope_scaling(self.rope_scaling)

    @property
    def num_query_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArchConfig:
        """Build from a HF config.json dict; raises ValueError naming the bad or missing field."""
        missing = [k for k in _REQUIRED if d.get(k) is None]
        if missing:
            raise ValueError(f"config.json is missing required field(s): {', '.join(missing)}")
        for flag in ("use_sliding_window", "mlp_bias"):
            if d.get(flag):
                raise ValueError(f"{flag}=true is not supported")
        model_type = d.get("model_type", "llama")
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or _div(d["hidden_size"], heads, "hidden_size")
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            model_type=model_type,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            rope_scaling=d.get("rope_scaling"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_as_ids(d.get("eos_token_id")),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ArchConfig:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config.json not found: {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object")
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """A HF-compatible config.json dict (round-trips through from_dict)."""
        d = asdict(self)
        qkv, o = d.pop("qkv_bias"), d.pop("o_bias")
        if self.model_type == "llama":
            if qkv != o:
                raise ValueError("llama config.json cannot express qkv_bias != o_bias")
            d["attention_bias"] = qkv
        eos = d.pop("eos_token_ids")
        d["eos_token_id"] = list(eos) if len(eos) > 1 else (eos[0] if eos else None)
        d["architectures"] = [
            "Qwen2ForCausalLM" if self.model_type == "qwen2" else "LlamaForCausalLM"
        ]
        d["hidden_act"] = "silu"
        return d


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def _div(a: Any, b: Any, name: str) -> int:
    _check_positive_int(name, a)
    _check_positive_int("num_attention_heads", b)
    if a % b:
        raise ValueError(f"{name}={a} is not divisible by num_attention_heads={b}; set head_dim")
    return a // b


def _as_ids(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, list) else (int(v),)


def _check_rope_scaling(rs: dict[str, Any] | None) -> None:
    if rs is None:
        return
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (only 'llama3')")
    for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if k not in rs:
            raise ValueError(f"rope_scaling is missing {k!r}")


def tiny_config(**overrides: Any) -> ArchConfig:
    """A small Llama-shaped config (2 layers, hidden 64, GQA 4:2) for tests and the CPU default.

    vocab 320 fits the tiny byte-level tokenizer; ids 0 and 2 are <|endoftext|> and <|im_end|>.
    """
    fields: dict[str, Any] = {
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 1024,
        "eos_token_ids": (2, 0),
    }
    return ArchConfig(**{**fields, **overrides})
