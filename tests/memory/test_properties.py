"""Random sequences of allocations, saves, restores, staging writes, copy progress and switches
against a deferred-copy device and a second (virtual) TP rank whose commits the test controls."""

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from talariad.memory import BlockState, KVLayout, PrefixAgreement
from talariad.memory.transfer import block_copies
from tests.support.props import examples

from .conftest import (
    DeferredDevice,
    fill_pages,
    make_substrate,
    model_shapes,
    page_bytes,
    small_config,
    weights_match_host,
)

SESSIONS = st.sampled_from(["s0", "s1", "s2"])
MODELS = st.sampled_from(["a", "b"])
LAYOUTS = {
    "a": KVLayout(num_layers=4, num_kv_heads=2, head_dim=8, page_size=4, dtype="float16"),
    "b": KVLayout(
        num_layers=4, num_kv_heads=2, head_dim=8, page_size=4, dtype="float16", order="page_first"
    ),
}


class SubstrateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dev = DeferredDevice()
        self.agree = PrefixAgreement(tp_size=2)
        config = small_config(
            capacity_bytes=360 << 10,
            host_kv_bytes=256 << 10,
            slab_bytes=4 << 10,
            chunk_bytes=8 << 10,
        )
        models = {"a": (model_shapes(512), LAYOUTS["a"]), "b": (model_shapes(256), LAYOUTS["b"])}
        self.sub = make_substrate(self.dev, config=config, models=models, agreement=self.agree)
        self.now, self.seed, self.serial = 0.0, 0, 0
        self.device_hashes: dict[str, list[str]] = {}  # session -> hash per device page
        self.saved_hashes: dict[tuple[str, str], list[str]] = {}
        self.expected: dict[tuple[str, str], bytes] = {}  # (model, hash) -> page bytes when saved
        self.peer: dict[tuple[str, str], list[str]] = {}  # what the virtual rank 1 committed

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    # ---- rules ---------------------------------------------------------------------------
    @initialize(model=MODELS)
    def open_first(self, model):
        assert self.sub.switch_to(model, self.tick()) is not None

    @rule(model=MODELS)
    def switch(self, model):
        rec = self.sub.switch_to(model, self.tick())
        if rec is None:
            return
        self.device_hashes.clear()
        assert weights_match_host(self.sub, model)  # so no dirty chunk was gathered by D2D
        assert rec.staged_bytes + rec.h2d_bytes == self.sub.models[model].nbytes
        event(f"switch path {rec.path.value}")

    @rule(session=SESSIONS, n=st.integers(1, 12))
    def allocate(self, session, n):
        self._allocate(session, n)

    def _allocate(self, session, n):
        pages = self.sub.allocate_pages(session, n)
        if pages is None:
            return
        self.seed += 1
        fill_pages(self.sub, pages, self.seed)
        hashes = self.device_hashes.setdefault(session, [])
        for _ in pages:
            self.serial += 1
            hashes.append(f"{session}#{self.serial}")

    @rule(session=SESSIONS)
    def checkpoint(self, session):
        hashes = self.device_hashes.get(session)
        if not hashes:
            return
        model = self.sub.active
        data = page_bytes(self.sub, self.sub.session_pages(session))
        for h, b in zip(hashes, data, strict=False):
            self.expected.setdefault((model, h), b)
        self.sub.checkpoint(session, hashes, self.tick())
        self.saved_hashes[(model, session)] = list(hashes)

    @rule(session=SESSIONS, keep=st.integers(0, 16))
    def kv_pressure(self, session, keep):
        """A long prefill takes all but `keep` free rows, running into staged chunks."""
        free = self.sub.pages.num_free - len(self.sub.staging.blocked_rows())
        if free - keep > 0:
            self._allocate(session, free - keep)

    @rule(session=SESSIONS, k=st.integers(0, 12))
    def finish_call(self, session, k):
        """A call ends: checkpoint, the peer rank commits (part of) the same prefix, pages go."""
        self.checkpoint(session)
        model = self.sub.active
        self.peer_commits(session, model, k, diverge=False)
        self.free(session)

    @rule(model=MODELS)
    def stage_fully(self, model):
        if self.sub.stage(model, self.tick()):
            self.sub.stage_step(self.now, 1000)

    @rule(session=SESSIONS)
    def free(self, session):
        self.sub.free_session(session)
        self.device_hashes.pop(session, None)

    @rule(session=SESSIONS)
    def restore(self, session):
        model = self.sub.active
        saved = sorted(
            s for (m, s) in self.saved_hashes if m == model and not self.sub.sessions.get(s)
        )
        session = session if session in saved or not saved else saved[0]
        hashes = self.saved_hashes.get((model, session), [])
        res = self.sub.restore(session, hashes, self.tick())
        if res is None:
            return
        self.sub.wait_restore(session)
        event(f"restored {res.restored_pages} of {len(hashes)}")
        assert res.restored_pages <= self._peer_prefix(model, hashes)
        restored = hashes[: res.restored_pages]
        assert page_bytes(self.sub, res.pages) == [self.expected[(model, h)] for h in restored]
        self.device_hashes[session] = list(restored)

    @rule(session=SESSIONS, model=MODELS, k=st.integers(0, 12), diverge=st.booleans())
    def peer_commits(self, session, model, k, diverge):
        hashes = self.saved_hashes.get((model, session), [])[:k]
        if diverge and hashes:
            hashes[-1] += "!"
        for h in self.peer.pop((model, session), []):
            self.agree.retract(1, (model, h))
        for h in hashes:
            self.agree.commit(1, (model, h))
        self.peer[(model, session)] = hashes

    @rule(model=MODELS)
    def stage(self, model):
        self.sub.stage(model, self.tick())

    @rule(n=st.integers(1, 8))
    def stage_step(self, n):
        self.sub.stage_step(self.tick(), n)

    @rule(n=st.integers(1, 40))
    def advance_copies(self, n):
        self.dev.advance(n)
        self.sub.poll(self.tick())

    # ---- invariants -------------------------------------------------------------------------
    def _peer_prefix(self, model, hashes):
        committed = {h for (m, _), hs in self.peer.items() if m == model for h in hs}
        n = 0
        while n < len(hashes) and hashes[n] in committed:
            n += 1
        return n

    @invariant()
    def integrity(self):
        self.sub.check_integrity()

    @invariant()
    def ready_blocks_hold_their_bytes_already(self):
        reg, host = self.sub.registry, self.sub.host_kv.host
        for (model, h), block in reg.blocks.items():
            if block.state is not BlockState.READY:
                continue
            geo_like = self.sub.shells[model]
            copies = block_copies(geo_like, 0, block.slabs, reg.pool.slab_bytes)
            got = b"".join(
                host[c.host_offset : c.host_offset + c.device.nbytes].numpy().tobytes()
                for c in copies
            )
            assert got == self.expected[(model, h)]

    @invariant()
    def nothing_beyond_agreement_is_exposed(self):
        for (model, _session), hashes in self.saved_hashes.items():
            family = self.sub.models[model].kv_layout.family
            assert self.sub.registry.restorable(model, hashes, family) <= self._peer_prefix(
                model, hashes
            )


SubstrateMachine.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=50, deadline=None
)
TestSubstrateProperties = SubstrateMachine.TestCase
