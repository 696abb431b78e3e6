import pytest

from talariad.perfmodel.profiles import Box, ModelSpec, ProfileSet, load_set
from talariad.replay.trace import Trace, TraceCall
from talariad.types import LatencyProfile

MODELS = ("qwen3-235b", "glm5-nvfp4", "qwen3.5-122b")


def session(sid: str, model: str, shape: list[tuple[int, int, int, float]]) -> list[TraceCall]:
    """shape: (prompt, prefix, output, gap) per call."""
    return [
        TraceCall(sid, k, model, p, x, o, g if k else 0.0) for k, (p, x, o, g) in enumerate(shape)
    ]


def growing(sid: str, model: str, calls: int, first: int = 20_000, out: int = 12, gap: float = 0.4):
    shape, prompt = [], first
    for k in range(calls):
        prefix = 0 if k == 0 else shape[-1][0] + shape[-1][2]
        prompt = first if k == 0 else prefix + 800
        shape.append((prompt, prefix, out + 3 * (k % 4), gap + 0.1 * (k % 3)))
    return session(sid, model, shape)


@pytest.fixture(scope="session")
def paper():
    return load_set("paper-tp8")


@pytest.fixture(scope="session")
def small_trace():
    """Six model-sessions over the three paper models, 5-7 calls each."""
    return Trace(growing(f"s{i}:{m}", m, 5 + i % 3) for i in range(2) for m in MODELS)


def toy_set(profile: LatencyProfile, model: str = "m") -> ProfileSet:
    box = Box(gpus=1, tp=1, hbm_per_gpu_bytes=1 << 40, host_memory_bytes=1 << 40)
    return ProfileSet("toy", box, {model: ModelSpec(model, profile)})
