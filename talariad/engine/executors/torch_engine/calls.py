"""A call's private state inside the torch executor (kept in InstanceCall.state)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from talariad.engine.executors.torch_engine.kv import TokenContext
from talariad.engine.executors.torch_engine.text import TextStream
from talariad.engine.model import SamplingParams


@dataclass(slots=True)
class CallState:
    """A call's private state (InstanceCall.state): its context ids, sampler and text stream."""

    call_id: str
    owner: str
    """Substrate owner of its pages: the session, or session#call when the session is busy."""
    model: str
    ids: list[int]
    prompt_len: int
    sampling: SamplingParams
    generator: torch.Generator | None
    text: TextStream
    rec: TokenContext
    ignore_eos: bool = False
    """Generate max_tokens whatever the model's end of turn (the request's `ignore_eos`)."""
