"""One view of a router decision: the picker's JSON is the daemon's admin message as JSON."""

from __future__ import annotations

import math

import pytest

from talariad.admin import views
from talariad.admin.client import as_dict
from talariad.router import CandidateCost, Decision, DecisionKind
from talariad.types import KVState
from talariad.wire.decision import decision_json


def _cand(instance: str, total_s: float, **kw) -> CandidateCost:
    base = dict(
        queue_s=0, prefill_s=0.25, decode_s=1, kv_recovery_s=0.0, activation_s=0.0, reason="ok"
    )
    return CandidateCost(instance, total_s=total_s, feasible=total_s < math.inf, **{**base, **kw})


DECISIONS = [
    Decision("c1", DecisionKind.COST, "box0", "talaria", 1.0, "cheapest", None, ()),
    Decision(
        "c2",
        DecisionKind.LEASE_HIT,
        "box1",
        "talaria",
        2.0,
        "lease",
        None,
        (_cand("box0", 3, kv_state=KVState.HOST), _cand("box1", 0.5, replica_s=2)),
    ),
    Decision(
        "c3",
        DecisionKind.OVERLOAD_REJECT,
        None,
        "talaria",
        5.0,
        "every box is full",
        2,
        (_cand("box0", math.inf, reason="round"), _cand("box1", -math.inf), _cand("b", math.nan)),
    ),
]


@pytest.mark.parametrize("d", DECISIONS, ids=lambda d: d.kind.value)
def test_the_pickers_json_is_the_daemons_message(d):
    assert decision_json(d, 4.0) == as_dict(views.decision(d, 4.0))
