"""Token sampling: greedy or temperature/top-p with a seeded generator per request; stop rules."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    """0 means greedy (argmax)."""
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    """When set, the model's EOS ids do not stop generation (stop_token_ids still do)."""
    seed: int | None = None
    """Seed of this request's generator; None draws one from torch's global RNG."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be a positive integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator (so a seed gives the same draws on any device); None when greedy."""
    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
    return torch.Generator().manual_seed(seed)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token per row of logits [B, vocab]."""
    logits = logits.float().cpu()
    return [_sample_row(row, p, g) for row, p, g in zip(logits, params, generators, strict=False)]


def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    if p.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits / p.temperature, dim=-1)
    if p.top_p < 1:
        probs = _top_p(probs, p.top_p)
    return int(torch.multinomial(probs, 1, generator=gen))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    # keep the smallest set of most likely tokens whose mass reaches top_p (always >= 1 token)
    sorted_probs, order = probs.sort(descending=True)
    drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs / sorted_probs.sum())


def finish_reason(
    token_id: int, num_generated: int, params: SamplingParams, eos_token_ids: tuple[int, ...]
) -> str | None:
    """'stop' on a stop/EOS token, 'length' at max_tokens, else None (keep going)."""
    if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in eos_token_ids):
        return "stop"
    if num_generated >= params.max_tokens:
        return "length"
    return None
