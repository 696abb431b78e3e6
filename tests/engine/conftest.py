"""Shared setup for the engine tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    # the test models are tiny: extra intra-op threads only add wake-up latency, badly so on a
    # loaded machine (measured 2x slower for this folder with 2 threads on 2 busy cores)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
