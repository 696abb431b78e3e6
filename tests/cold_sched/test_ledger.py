"""The session KV ledger keeps its per-model device totals and session index in step with its
entries, whatever order of writes, demotions and drops reaches it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from talariad.cold_sched.calls import SessionLedger
from talariad.types import KVState

SESSIONS, MODELS = ["s0", "s1", "s2", "s3"], ["A", "B"]
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("set"),
            st.sampled_from(SESSIONS),
            st.sampled_from(MODELS),
            st.sampled_from(list(KVState)),
            st.integers(-5, 5000),
        ),
        st.tuples(st.just("drop"), st.sampled_from(SESSIONS)),
        st.tuples(
            st.just("demote"),
            st.sampled_from(MODELS),
            st.sampled_from([KVState.HOST, KVState.MISSING]),
            st.frozensets(st.sampled_from(SESSIONS)),
        ),
    ),
    max_size=60,
)


def device_sums(ledger: SessionLedger) -> dict[str, int]:
    sums = dict.fromkeys(MODELS, 0)
    for (_, model), entry in ledger.entries.items():
        if entry.state is KVState.DEVICE:
            sums[model] += entry.kv_len
    return sums


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_device_totals_follow_every_change(ops):
    ledger = SessionLedger()
    for now, op in enumerate(ops):
        if op[0] == "set":
            ledger.set(*op[1:], float(now))
        elif op[0] == "drop":
            had = sum(k[0] == op[1] for k in ledger.entries)
            assert ledger.drop(op[1]) == had
            assert not any(k[0] == op[1] for k in ledger.entries)
        else:
            ledger.demote(op[1], op[2], float(now), op[3])
        assert {m: ledger.device_tokens.get(m, 0) for m in MODELS} == device_sums(ledger)
        ledger.check_integrity()


def test_a_ledger_built_from_entries_totals_them():
    ledger = SessionLedger()
    ledger.set("s0", "A", KVState.DEVICE, 10, 0.0)
    ledger.set("s1", "A", KVState.HOST, 20, 0.0)
    ledger.set("s1", "B", KVState.DEVICE, 30, 0.0)
    copy = SessionLedger(dict(ledger.entries))
    assert copy.device_tokens == {"A": 10, "B": 30} == ledger.device_tokens
    assert copy.drop("s1") == 2 and copy.device_tokens == {"A": 10, "B": 0}


def test_an_empty_device_prefix_drops_cleanly():
    """Found by the property test: a DEVICE entry of length 0 adds nothing to the totals, so its
    drop must not subtract from a total that was never made."""
    ledger = SessionLedger()
    ledger.set("s0", "A", KVState.DEVICE, 0, 0.0)
    assert ledger.drop("s0") == 1 and not ledger.entries
    ledger.check_integrity()
