"""A response id the client saw names the call at both levels (the box's admin `Explain` and the
picker's `/calls/ID`): `bare_call_id` takes each API's prefix off, and nothing else."""

from __future__ import annotations

import pytest

from talariad.calls.spec import bare_call_id, make_call_id


@pytest.mark.parametrize("prefix", ["chatcmpl-", "cmpl-", "msg_", "resp_"])
def test_each_apis_response_id_names_its_call(prefix):
    call = make_call_id()
    assert bare_call_id(f"{prefix}{call}") == call


def test_a_bare_or_foreign_id_is_kept_as_it_is():
    assert bare_call_id("0badc0ffee") == "0badc0ffee"
    assert bare_call_id("req_abc") == "req_abc"
