"""The daemon fixture of the whole-appliance tests (a sim-executor daemon per module)."""

from __future__ import annotations

import pytest

from tests.support.daemon import start_daemon, stop_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    # these tests count the sim executor's placeholder words; tests/e2e/test_torch_daemon.py runs
    # the default (torch) engine
    d = start_daemon(tmp_path_factory.mktemp("talariad"), executor="sim")
    yield d
    stop_daemon(d)
    d.notify.close()
