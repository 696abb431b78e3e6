"""Checkpoints: load a local HF-format directory, build seeded random weights, write a tiny one.

A checkpoint directory holds config.json, *.safetensors (one file, or shards listed by
model.safetensors.index.json), tokenizer.json, and optionally tokenizer_config.json,
chat_template.jinja and generation_config.json. Nothing is ever downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

from talariad.engine.model.config import ArchConfig, tiny_config
from talariad.engine.model.llama import LM_HEAD, Params, check_params, param_shapes
from talariad.engine.model.tokenizer import (
    FALLBACK_CHAT_TEMPLATE,
    TextTokenizer,
    build_tiny_tokenizer,
    read_json,
)

INDEX_FILE = "model.safetensors.index.json"


@dataclass(slots=True)
class Checkpoint:
    config: ArchConfig
    params: Params
    tokenizer: TextTokenizer


def default_dtype(device: str | torch.device) -> torch.dtype:
    """float32 on the CPU (exact, fast enough for small models), bfloat16 on accelerators."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> Checkpoint:
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint directory not found: {path}")
    config = load_config(path)
    tokenizer = TextTokenizer.from_dir(path)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} tokens but vocab_size={config.vocab_size}"
        )
    params = load_params(path, config, device, dtype or default_dtype(device))
    return Checkpoint(config, params, tokenizer)


def load_config(path: Path) -> ArchConfig:
    """config.json, with EOS ids from generation_config.json when it names them."""
    config = ArchConfig.from_json(path / "config.json")
    eos = read_json(path / "generation_config.json").get("eos_token_id")
    if eos is None:
        return config
    return dataclasses.replace(config, eos_token_ids=tuple(eos if isinstance(eos, list) else [eos]))


def safetensors_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path}")
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise ValueError(f"{INDEX_FILE} names missing shard(s): {absent}")
    return files


def load_params(path: Path, config: ArchConfig, device, dtype: torch.dtype) -> Params:
    """Read the tensors the model uses (others are ignored), cast, and check their shapes."""
    wanted = param_shapes(config)
    params: Params = {}
    for file in safetensors_files(path):
        params.update(_read_safetensors(file, wanted, device, dtype))
    if LM_HEAD not in wanted and LM_HEAD in params:  # tied: the embedding is the head
        del params[LM_HEAD]
    check_params(config, params)
    return params


def _read_safetensors(file: Path, wanted, device, dtype: torch.dtype) -> Params:
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names = [n for n in f.keys() if n in wanted or n == LM_HEAD]
            return {n: f.get_tensor(n).to(device=device, dtype=dtype) for n in names}
    except Exception as e:  # safetensors' Rust errors are not OSError subclasses
        raise ValueError(f"cannot read {file.name}: {e}") from None


def random_weights(
    config: ArchConfig,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Params:
    """Seeded weights, identical on every device; scaled so logits are O(1) and argmax is stable."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: _random_tensor(name, shape, gen).to(device=device, dtype=dtype)
        for name, shape in param_shapes(config).items()
    }


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith(".bias"):
        return 0.1 * noise
    if name == "model.embed_tokens.weight":
        return noise
    return noise / math.sqrt(shape[-1])


def write_checkpoint(
    path: str | Path,
    config: ArchConfig,
    params: Params,
    tokenizer: Tokenizer,
    chat_template: str | None = FALLBACK_CHAT_TEMPLATE,
    num_shards: int = 1,
    eos_token: str = "<|im_end|>",
) -> Path:
    """Write an HF-format directory that load_checkpoint (and HF tools) can read."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {**config.to_dict(), "torch_dtype": _dtype_name(next(iter(params.values())).dtype)}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    _write_shards(path, params, num_shards)
    tokenizer.save(str(path / "tokenizer.json"))
    tok_cfg = {"eos_token": eos_token, "chat_template": chat_template}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    return path


def _write_shards(path: Path, params: Params, num_shards: int) -> None:
    if num_shards < 1:
        raise ValueError(f"num_shards={num_shards} must be >= 1")
    names = list(params)
    per = -(-len(names) // num_shards)
    groups = [names[i : i + per] for i in range(0, len(names), per)]
    if len(groups) == 1:
        save_file(_host_copy(params, names), str(path / "model.safetensors"))
        return
    weight_map = {}
    for i, group in enumerate(groups, start=1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(_host_copy(params, group), str(path / file))
        weight_map.update(dict.fromkeys(group, file))
    (path / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))


def _host_copy(params: Params, names: list[str]) -> dict[str, torch.Tensor]:
    return {n: params[n].detach().to("cpu").contiguous().clone() for n in names}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def write_tiny_checkpoint(
    path: str | Path, config: ArchConfig | None = None, seed: int = 0, num_shards: int = 1
) -> Path:
    """A complete tiny model directory: config, seeded random weights, byte-level BPE tokenizer."""
    config = config or tiny_config()
    tokenizer = build_tiny_tokenizer(min(config.vocab_size, 320))
    return write_checkpoint(
        path, config, random_weights(config, seed), tokenizer, num_shards=num_shards
    )
