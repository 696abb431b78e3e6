"""Fitting each replayed call into its model's context (the README replay example on 8K models)."""

from __future__ import annotations

import math

from talariad.replay.scale import Conversation, ScaledCall, count_tokens, fit_context


def _call(new: int, max_tokens: int, idx: int = 0) -> ScaledCall:
    return ScaledCall("s", idx, "m", "m", new, 1.0, max_tokens, 0.0)


def _need(conv: Conversation, ratio: float) -> int:
    return math.ceil(ratio * conv.tokens()) + 1


def test_a_call_that_fits_is_left_alone():
    conv = Conversation("s")
    conv.messages(_call(300, 64))
    before = [dict(m) for m in conv.history]
    call, changed = fit_context(conv, _call(300, 64), 2.0, 8192)
    assert not changed and call.max_tokens == 64 and conv.history == before


def test_history_is_compacted_oldest_first_and_the_system_prompt_kept():
    conv = Conversation("s")
    conv.messages(_call(600, 200))
    for i in range(1, 12):
        conv.answered("answer " * 200)
        conv.messages(_call(400, 200, i))
    system, newest = conv.history[0], conv.history[-1]
    assert _need(conv, 3.0) + 200 > 8192 * 0.95
    call, changed = fit_context(conv, _call(400, 200, 12), 3.0, 8192)
    assert changed and call.max_tokens == 200
    assert conv.history[0] is system and conv.history[-1] is newest
    assert _need(conv, 3.0) + call.max_tokens <= 8192 * 0.95


def test_a_single_prompt_too_large_is_cut_and_max_tokens_lowered():
    conv = Conversation("s")
    conv.messages(_call(5000, 4000))
    call, changed = fit_context(conv, _call(5000, 4000), 3.0, 8192)
    assert changed and call.max_tokens <= 8192 // 4
    assert _need(conv, 3.0) + call.max_tokens <= 8192 * 0.95
    assert count_tokens(conv.history[-1]["content"]) > 0
