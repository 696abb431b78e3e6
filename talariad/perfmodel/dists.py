"""Seeded distributions fitted to published quantiles (lognormal by p50/p95) used by the generators."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.6448536269514722  # standard normal quantile at 0.95


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A lognormal given by its median and 95th percentile: ln X ~ N(ln p50, sigma)."""

    p50: float
    p95: float

    def __post_init__(self) -> None:
        if not 0 < self.p50 < self.p95:
            raise ValueError(f"lognormal needs 0 < p50 < p95, got p50={self.p50} p95={self.p95}")

    @property
    def mu(self) -> float:
        return math.log(self.p50)

    @property
    def sigma(self) -> float:
        return math.log(self.p95 / self.p50) / Z95

    def sample(self, rng: np.random.Generator, n: int | None = None):
        return rng.lognormal(self.mu, self.sigma, n)

    def sample_int(self, rng: np.random.Generator, lo: int = 1) -> int:
        return max(lo, int(round(float(self.sample(rng)))))


# §2.1 / Figure 2 (445 SWE-bench Verified sessions): the paper's characterization targets.
DEPTH = LogNormal(11, 49)
TOOL_GAP_S = LogNormal(0.39, 1.32)
PROMPT_TOKENS = LogNormal(
    25_000, 105_000
)  # the marginal target; generated prompts grow per session
REUSE_OVER_HALF = 0.968

# Assumption: output lengths follow the shared real trace's README (mini-swe-agent on SWE-bench
# Verified: output tokens p50 89 / p95 1,038); the paper publishes no output-length distribution.
OUTPUT_TOKENS = LogNormal(89, 1038)

# Growth model, calibrated once (seed-independent constants) so that the marginal prompt
# distribution over all calls lands near PROMPT_TOKENS: a session starts from a system prompt
# plus the issue (FIRST_PROMPT) and each continuation appends the previous answer plus a tool
# observation (OBSERVATION).
FIRST_PROMPT = LogNormal(9_000, 28_000)
OBSERVATION = LogNormal(300, 4_500)

REPLAY_GAP_CAP_S = 10.0  # §5.1 / App. A: the fixed replay caps each recorded gap at 10 s
