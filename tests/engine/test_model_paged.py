"""Paged attention: cached prefixes, batching and page layout reproduce the dense logits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.engine.model import DecodeSeq, PrefillSeq, kv_pool_shape
from tests.engine.model_reference import (
    DEVICES,
    PROMPT,
    dense_logits,
    make_runner,
    scrambled_table,
    tol,
)

CONFIGS = {
    "llama-gqa": {},
    "mha": {"num_key_value_heads": 4},
    "mqa": {"num_key_value_heads": 1},
    "tied": {"tie_word_embeddings": True},
    "qwen2-bias": {"model_type": "qwen2", "qkv_bias": True},
    "llama-all-bias": {"qkv_bias": True, "o_bias": True},
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_whole_prompt_matches_dense_reference(device, overrides):
    runner = make_runner(device, **overrides)
    table = scrambled_table(runner, "r", len(PROMPT))
    got = runner.prefill([PrefillSeq("r", PROMPT, 0, table)], all_logits=True)
    want = dense_logits(runner.config, runner.params, PROMPT)
    torch.testing.assert_close(got, want, **tol(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cached", [1, 4, 13, 36, 37])
def test_cached_prefix_gives_whole_prompt_logits(device, cached):
    runner = make_runner(device)
    table = scrambled_table(runner, "r", len(PROMPT))
    whole = runner.prefill([PrefillSeq("r", PROMPT, 0, table)], all_logits=True)
    runner.kv_pool.zero_()
    runner.prefill([PrefillSeq("r", PROMPT[:cached], 0, table)])
    tail = runner.prefill([PrefillSeq("r", PROMPT, cached, table)], all_logits=True)
    start = min(cached, len(PROMPT) - 1)  # a fully cached prompt recomputes its last token
    torch.testing.assert_close(tail, whole[start:], **tol(device))


def test_cached_prefix_is_actually_read_from_the_pool():
    runner = make_runner()
    table = scrambled_table(runner, "r", len(PROMPT))
    runner.prefill([PrefillSeq("r", PROMPT[:20], 0, table)])
    good = runner.prefill([PrefillSeq("r", PROMPT, 20, table)])
    runner.kv_pool[:, :, table[0]] += 1.0  # corrupt the cached prefix's first page
    bad = runner.prefill([PrefillSeq("r", PROMPT, 20, table)])
    assert not torch.allclose(good, bad, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_batched_prefill_and_decode_equal_one_at_a_time(device):
    prompts, cached = [PROMPT[:9], PROMPT, PROMPT[3:20], [11]], [0, 17, 8, 0]
    alone, batched = make_runner(device), make_runner(device)
    tables = [scrambled_table(alone, i, 48, seed=i) for i in range(4)]  # same pages in both pools
    items = [
        PrefillSeq(i, p, c, tables[i])
        for i, (p, c) in enumerate(zip(prompts, cached, strict=False))
    ]
    for runner in (alone, batched):  # fill the cached prefixes one by one
        for it in items:
            if it.cached_len:
                runner.prefill(
                    [PrefillSeq(it.req_id, it.token_ids[: it.cached_len], 0, it.block_table)]
                )
    one = torch.cat([alone.prefill([it]) for it in items])
    torch.testing.assert_close(batched.prefill(items), one, **tol(device))
    steps = [DecodeSeq(i, 42 + i, len(p), tables[i]) for i, p in enumerate(prompts)]
    one = torch.cat([alone.decode([it]) for it in steps])
    torch.testing.assert_close(batched.decode(steps), one, **tol(device))


def test_decode_matches_dense_reference_after_cached_steps():
    runner = make_runner()
    table = scrambled_table(runner, "r", len(PROMPT) + 3)
    runner.prefill([PrefillSeq("r", PROMPT, 0, table)])
    seq = list(PROMPT)
    for tok in (3, 99, 250):
        got = runner.decode([DecodeSeq("r", tok, len(seq), table)])
        seq.append(tok)
        torch.testing.assert_close(
            got[0], dense_logits(runner.config, runner.params, seq)[-1], **tol("cpu")
        )


def test_writes_touch_only_the_requests_pages():
    runner = make_runner()
    runner.kv_pool.normal_()
    before = runner.kv_pool.clone()
    table = scrambled_table(runner, "r", len(PROMPT))
    runner.prefill([PrefillSeq("r", PROMPT, 0, table)])
    others = [p for p in range(runner.allocator.num_pages) if p not in table]
    torch.testing.assert_close(runner.kv_pool[:, :, others], before[:, :, others], rtol=0, atol=0)
    assert not torch.equal(runner.kv_pool[:, :, table], before[:, :, table])


def test_params_and_pool_rebind_to_views_of_flat_buffers():
    runner = make_runner()
    table = runner.allocator.allocate("r", len(PROMPT))
    want = runner.prefill([PrefillSeq("r", PROMPT, 0, table)], all_logits=True)
    flat = torch.cat([t.flatten() for t in runner.params.values()])
    views, offset = {}, 0
    for name, t in runner.params.items():
        views[name] = flat[offset : offset + t.numel()].view(t.shape)
        offset += t.numel()
    runner.bind_params(views)
    shape = kv_pool_shape(runner.config, runner.allocator.num_pages, runner.page_size)
    region = torch.zeros(1000 + torch.Size(shape).numel())
    runner.bind_kv_pool(region[1000:].view(shape))
    got = runner.prefill([PrefillSeq("r", PROMPT, 0, table)], all_logits=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert region[1000:].abs().sum() > 0  # the KV landed in the caller's buffer
    flat[: runner.config.vocab_size * runner.config.hidden_size] = (
        0  # weights are views: zero embed
    )
    assert not torch.equal(runner.prefill([PrefillSeq("r", PROMPT, 0, table)]), want[-1:])


def test_bind_rejects_wrong_shapes():
    runner = make_runner()
    with pytest.raises(ValueError, match="kv_pool"):
        runner.bind_kv_pool(torch.zeros(3, 2, 1))
    bad = dict(runner.params)
    bad["model.norm.weight"] = torch.zeros(7)
    with pytest.raises(ValueError, match="model.norm.weight"):
        runner.bind_params(bad)
    with pytest.raises(ValueError, match="missing"):
        runner.bind_params({})


def test_item_validation():
    runner = make_runner()
    with pytest.raises(ValueError, match="cannot hold"):
        runner.prefill([PrefillSeq("r", PROMPT, 0, [0, 1])])
    with pytest.raises(ValueError, match="outside the pool"):
        runner.prefill([PrefillSeq("r", [1, 2], 0, [999])])


@settings(max_examples=15, deadline=None)
@given(
    length=st.integers(1, len(PROMPT)),  # a longer draw would be cut to the prompt's length
    split=st.floats(0, 1),
    page_size=st.sampled_from([1, 3, 8, 16]),
    seed=st.integers(0, 1000),
)
def test_any_split_and_page_size_match_dense(length, split, page_size, seed):
    runner = make_runner(num_pages=64, page_size=page_size)
    prompt = PROMPT[:length]
    # the engine always computes at least the last prompt token (it needs its logits), so a
    # prefill never starts with the whole prompt cached
    cached = min(int(split * length), length - 1)
    table = scrambled_table(runner, "r", length, seed)
    if cached:
        runner.prefill([PrefillSeq("r", prompt[:cached], 0, table)])
    got = runner.prefill([PrefillSeq("r", prompt, cached, table)], all_logits=True)
    want = dense_logits(runner.config, runner.params, prompt)
    torch.testing.assert_close(got, want[min(cached, length - 1) :], **tol("cpu"))
