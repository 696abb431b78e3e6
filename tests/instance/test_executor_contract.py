"""Every executor implements the whole executor contract, with the contract's sync/async split:
the core and the instance process call its members directly, never through `getattr`."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import talariad
from talariad.engine.executors.sglang.executor import SGLangExecutor
from talariad.engine.executors.sim import SimExecutor
from talariad.instance.contract import Executor, ExecutorState
from talariad.perfmodel.model import SimModel
from tests.instance.test_instance_core import Recorder, Words
from tests.support.scripted import ScriptedExecutor


def methods(protocol) -> dict[str, bool]:
    """The protocol's methods (its bases' too), each with whether it is a coroutine."""
    out = {}
    for cls in reversed(protocol.__mro__):
        if cls is not protocol and cls not in (Executor, ExecutorState):
            continue
        for name, member in vars(cls).items():
            if not name.startswith("_") and inspect.isfunction(member):
                out[name] = inspect.iscoroutinefunction(member)
    return out


def test_the_contract_names_every_hook():
    assert {"load", "unload", "forget", "remember", "release", "memory"} <= set(
        methods(ExecutorState)
    )
    assert {"start", "aclose", "run", "encode", "reusable", "memory_report"} <= set(
        methods(Executor)
    )


def executors() -> list[type]:
    found = [SimExecutor, SGLangExecutor, ScriptedExecutor]
    try:
        from talariad.engine.executors.torch_exec import TorchExecutor
    except ImportError:  # no torch in this build: the torch executor cannot be built either
        return found
    return found + [TorchExecutor]


@pytest.mark.parametrize("cls", executors(), ids=lambda c: c.__name__)
def test_each_executor_implements_the_whole_contract(cls):
    for name, is_async in methods(Executor).items():
        member = getattr(cls, name, None)
        assert member is not None, f"{cls.__name__} lacks {name}"
        assert inspect.iscoroutinefunction(member) == is_async, f"{cls.__name__}.{name}"


@pytest.mark.parametrize("cls", [SimModel, Recorder, Words], ids=lambda c: c.__name__)
def test_the_cores_state_side_is_implemented_by_the_simulator_and_test_stand_ins(cls):
    for name, is_async in methods(ExecutorState).items():
        member = getattr(cls, name, None)
        assert member is not None and not is_async, f"{cls.__name__}.{name}"


def test_no_executor_member_is_looked_up_with_getattr():
    root = Path(talariad.__file__).parent
    pattern = re.compile(r"getattr\([^,]*executor")
    for folder in ("engine", "instance", "sim"):
        for path in (root / folder).rglob("*.py"):
            assert not pattern.search(path.read_text()), path.relative_to(root)
