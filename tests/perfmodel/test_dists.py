"""The workload distributions are fitted to the quantiles they are given."""

from __future__ import annotations

import numpy as np
import pytest

from talariad.perfmodel.dists import TOOL_GAP_S, LogNormal


@pytest.mark.parametrize("dist", [LogNormal(11, 49), TOOL_GAP_S, LogNormal(89, 1038)])
def test_a_lognormal_lands_on_its_p50_and_p95(dist):
    sample = dist.sample(np.random.default_rng(7), 200_000)
    p50, p95 = np.quantile(sample, [0.5, 0.95])
    assert p50 == pytest.approx(dist.p50, rel=0.02)
    assert p95 == pytest.approx(dist.p95, rel=0.03)


def test_the_same_seed_draws_the_same_workload():
    a, b = (LogNormal(11, 49).sample(np.random.default_rng(3), 5) for _ in range(2))
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("p50, p95", [(0, 1), (2, 2), (3, 1)])
def test_quantiles_out_of_order_are_refused(p50, p95):
    with pytest.raises(ValueError, match="p50 < p95"):
        LogNormal(p50, p95)
