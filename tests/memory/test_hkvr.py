import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.memory import BlockState, HostKVRegistry, KVLayout, PrefixAgreement, prefix_hashes
from talariad.memory.slabs import SlabPool

LAY = KVLayout(
    num_layers=4, num_kv_heads=1, head_dim=8, page_size=4, dtype="float16"
)  # 64 B fragments


def make(num_slabs=16, tp_size=1, slab_bytes=128):
    return HostKVRegistry(SlabPool(num_slabs, slab_bytes), PrefixAgreement(tp_size), rank=0)


def test_prefix_hashes_are_cumulative_and_page_aligned():
    a, b = prefix_hashes(list(range(10)), 4), prefix_hashes([0, 1, 2, 3, 9, 9, 9, 9], 4)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]


def test_blocks_are_hidden_until_copy_completes():
    reg = make()
    todo = reg.begin_save("m", "s", ["h1", "h2"], LAY)
    assert [b.state for _, b in todo] == [BlockState.PENDING] * 2
    assert reg.restorable("m", ["h1", "h2"]) == 0
    reg.complete_save(todo[0][1])
    assert reg.restorable("m", ["h1", "h2"]) == 1
    reg.check_integrity()


def test_slab_count_follows_layout_and_slab_size():
    reg = make(slab_bytes=128)  # 2 layers per slab -> 2 slabs per component
    ((_, block),) = reg.begin_save("m", "s", ["h"], LAY)
    assert len(block.slabs) == 4 and block.desc.family == "mha" and block.desc.tokens == 4
    with pytest.raises(ValueError, match="slab_bytes"):
        make(slab_bytes=32).begin_save("m", "s", ["h"], LAY)


def test_prefix_exposed_only_up_to_all_rank_agreement():
    agree = PrefixAgreement(tp_size=2)
    r0 = HostKVRegistry(SlabPool(32, 256), agree, rank=0)
    r1 = HostKVRegistry(SlabPool(32, 256), agree, rank=1)
    for _, b in r0.begin_save("m", "s", ["h1", "h2", "h3"], LAY):
        r0.complete_save(b)
    assert r0.restorable("m", ["h1", "h2", "h3"]) == 0  # rank 1 has committed nothing
    for _, b in r1.begin_save("m", "s", ["h1", "h2", "x3"], LAY):  # diverges at page 3
        r1.complete_save(b)
    assert r0.restorable("m", ["h1", "h2", "h3"]) == 2 == r1.restorable("m", ["h1", "h2", "x3"])


def test_pinned_blocks_survive_eviction_and_lru_trims_tails_first():
    reg = make(num_slabs=8, slab_bytes=256)  # 2 slabs per block -> 4 blocks
    for _, b in reg.begin_save("m", "old", ["a1", "a2"], LAY):
        reg.complete_save(b)
    pinned = reg.blocks_for("m", ["a1"])
    reg.pin(pinned)
    for _, b in reg.begin_save("m", "new", ["b1", "b2"], LAY):
        reg.complete_save(b)
    todo = reg.begin_save("m", "newer", ["c1"], LAY)
    assert len(todo) == 1
    assert ("m", "a1") in reg.blocks and ("m", "a2") not in reg.blocks
    reg.complete_save(todo[0][1])
    reg.check_integrity()


def test_save_stops_at_first_page_that_cannot_be_held():
    reg = make(num_slabs=4, slab_bytes=256)
    todo = reg.begin_save("m", "s", ["h1", "h2", "h3"], LAY)  # all pinned: no eviction possible
    assert [i for i, _ in todo] == [0, 1]


def test_radix_refs_are_separate_from_pins_and_unreferenced_go_first():
    reg = make(num_slabs=4, slab_bytes=256)
    for _, b in reg.begin_save("m", "s1", ["a"], LAY):
        reg.complete_save(b)
    for _, b in reg.begin_save("m", "s2", ["b"], LAY):
        reg.complete_save(b)
    reg.drop_session("m", "s2")
    assert reg.blocks[("m", "b")].radix_refs == set() and reg.blocks[("m", "b")].dma_pins == 0
    todo = reg.begin_save("m", "s3", ["c"], LAY)
    reg.complete_save(todo[0][1])
    assert ("m", "a") in reg.blocks and ("m", "b") not in reg.blocks


def test_mamba_restorable_is_the_deepest_agreed_state():
    lay = KVLayout(num_layers=2, family="mamba", state_bytes=64, dtype="float32")
    reg = make(slab_bytes=128)
    todo = reg.begin_save("m", "s", ["h1", "h2", "h3"], lay)
    assert [i for i, _ in todo] == [2]  # one state block at the deepest boundary
    reg.complete_save(todo[0][1])
    assert reg.restorable("m", ["h1", "h2", "h3"], family="mamba") == 3
    assert reg.restorable("m", ["h1", "h2", "h3", "h4"], family="mamba") == 3


class SortedEviction(HostKVRegistry):
    """The plain reading of the rule: sort every unpinned block, unreferenced first, then LRU."""

    def _evict_for(self, n: int) -> list[int] | None:
        victims = sorted(
            (b for b in self.blocks.values() if b.dma_pins == 0),
            key=lambda b: (bool(b.radix_refs), b.last_use),
        )
        if self.pool.num_free + sum(len(b.slabs) for b in victims) < n:
            return None
        for block in victims:
            if self.pool.can_alloc(n):
                break
            self.evict(block)
        return self.pool.alloc(n)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["save", "save", "save", "drop", "pin", "unpin"]),
        st.integers(0, 7),  # session
        st.integers(1, 5),  # pages
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_heap_eviction_evicts_what_the_sorted_rule_evicts(ops):
    fast = HostKVRegistry(SlabPool(24, 256), PrefixAgreement(1), max_sessions=5)
    slow = SortedEviction(SlabPool(24, 256), PrefixAgreement(1), max_sessions=5)
    pinned: dict[int, list] = {}
    for op, s, pages in ops:
        # sessions share their first page(s) as agents share a system prompt
        hashes = [f"head{p}" if p < s % 3 else f"s{s}p{p}" for p in range(pages)]
        for reg in (fast, slow):
            if op == "save":
                for _, block in reg.begin_save("m", f"s{s}", hashes, LAY):
                    reg.complete_save(block)
            elif op == "drop":
                reg.drop_session("m", f"s{s}")
            elif op == "pin" and (id(reg), s) not in pinned:
                pinned[(id(reg), s)] = reg.blocks_for("m", hashes)
                reg.pin(pinned[(id(reg), s)])
            elif op == "unpin" and (id(reg), s) in pinned:
                reg.unpin(pinned.pop((id(reg), s)))
            reg.check_integrity()
        assert fast.blocks.keys() == slow.blocks.keys()
        assert fast.sessions == slow.sessions
        assert fast.take_shrunk() == slow.take_shrunk()


def test_sessions_are_bounded_and_evicted_pages_cut_them_back():
    def five_sessions(max_sessions):
        reg = HostKVRegistry(SlabPool(8, 256), PrefixAgreement(1), max_sessions=max_sessions)
        for i in range(5):  # a shared head page and a private one each; 4 blocks fit
            for _, block in reg.begin_save("m", f"s{i}", ["head", f"s{i}"], LAY):
                reg.complete_save(block)
            reg.check_integrity()
        return reg

    # every session remembered: the oldest private pages go, their sessions cut back to the head
    reg = five_sessions(10)
    assert reg.sessions[("m", "s0")] == ["head"] == reg.sessions[("m", "s1")]
    assert reg.take_shrunk() == {("m", "s0"): 1, ("m", "s1"): 1}
    assert reg.restorable("m", ["head", "s0"]) == 1 and reg.restorable("m", ["head", "s4"]) == 2
    # three sessions at most: the least recently saved are forgotten, so their pages go first
    reg = five_sessions(3)
    assert list(reg.sessions) == [("m", "s2"), ("m", "s3"), ("m", "s4")]
    assert reg.take_shrunk() == {("m", "s0"): 0, ("m", "s1"): 0}
    assert set(reg.blocks) == {("m", h) for h in ("head", "s2", "s3", "s4")}
