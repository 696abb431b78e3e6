"""App. B at the model level: a session's prefix restored from a host copy after another model
overwrote its pages gives the same greedy tokens as recomputing it and as never switching."""

from __future__ import annotations

import pytest
import torch

from talariad.engine.model import (
    ModelRunner,
    PrefillSeq,
    SamplingParams,
    make_kv_pool,
    random_weights,
    tiny_config,
)
from tests.engine.model_reference import DEVICES, PROMPT, dense_greedy

PAGE = 4
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def turn(runner: ModelRunner, req_id, tokens, cached_len: int, table) -> list[int]:
    return runner.generate_batch([PrefillSeq(req_id, tokens, cached_len, table)], [GREEDY])[
        0
    ].token_ids


@pytest.mark.parametrize("device", DEVICES)
def test_restored_prefix_equals_recompute_and_never_switched(device):
    config = tiny_config(eos_token_ids=())
    mine, other = random_weights(config, 0, device), random_weights(config, 5, device)
    pool = make_kv_pool(config, num_pages=48, page_size=PAGE, dtype=torch.float32, device=device)
    runner = ModelRunner(config, mine, kv_pool=pool)
    alloc = runner.allocator
    # 1. first call of the session; its KV stays in the pages
    prompt1, tool_result = PROMPT[:21], [17, 4, 250, 9, 61]
    first = turn(runner, "s", prompt1, 0, alloc.allocate("s", 48))
    committed = len(prompt1) + len(first) - 1  # the last sampled token has no KV yet
    turn2 = prompt1 + first + tool_result
    # 2. checkpoint the page-aligned agreed prefix to host memory
    agreed = committed // PAGE * PAGE
    host = runner.read_pages(alloc.block_table("s")[: agreed // PAGE]).cpu()
    never_switched = turn(runner, "s", turn2, committed, alloc.block_table("s"))
    # 3. forced switch: another model reuses the same pages, then we switch back
    runner.bind_params(other)
    turn(runner, "x", PROMPT, 0, alloc.block_table("s"))
    assert not torch.equal(runner.read_pages(alloc.block_table("s")[:1]).cpu(), host[:, :, :1])
    runner.bind_params(mine)
    # 4. restore the prefix into fresh pages and recompute only the tail
    table = alloc.allocate("restored", 48)
    runner.write_pages(table[: agreed // PAGE], host)
    restored = turn(runner, "restored", turn2, agreed, table)
    recomputed = turn(runner, "recomputed", turn2, 0, alloc.allocate("recomputed", 48))
    assert restored == recomputed == never_switched
    assert restored == dense_greedy(config, mine, turn2, GREEDY.max_tokens)
    alloc.check_integrity()


def test_a_stale_prefix_changes_the_tokens():
    """Guards the test above: if the restore were skipped, the output would differ."""
    config = tiny_config(eos_token_ids=())
    runner = ModelRunner(config, random_weights(config, 0), num_pages=32, page_size=PAGE)
    table = runner.allocator.allocate("s", 48)
    good = turn(runner, "s", PROMPT, 0, table)
    noise = torch.randn(runner.kv_pool[:, :, table[:8]].shape, generator=torch.Generator())
    runner.kv_pool[:, :, table[:8]] = noise
    assert turn(runner, "s", PROMPT, 32, table) != good


def test_runner_takes_geometry_from_a_given_pool():
    config = tiny_config()
    pool = make_kv_pool(config, num_pages=10, page_size=8, dtype=torch.float32, device="cpu")
    runner = ModelRunner(config, random_weights(config), kv_pool=pool)
    assert (runner.allocator.num_pages, runner.page_size) == (10, 8)
    assert runner.kv_pool is pool
    with pytest.raises(ValueError, match="kv_pool"):
        ModelRunner(config, random_weights(config), kv_pool=torch.zeros(2, 2))
