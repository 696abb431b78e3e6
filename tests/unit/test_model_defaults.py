"""Per-model settings of the torch engine: sampling defaults for calls that set none, the chat
template and dtype a model is served with."""

from __future__ import annotations

import pytest

from talariad.config import ModelConfig
from talariad.gateway.anthropic import MessagesRequest
from talariad.gateway.app import _sampling
from talariad.gateway.responses import ResponsesRequest
from talariad.gateway.schemas import ChatCompletionRequest

MSG = [{"role": "user", "content": "hi"}]
BODIES = [
    (ChatCompletionRequest, {"model": "m", "messages": MSG}),
    (MessagesRequest, {"model": "m", "messages": MSG, "max_tokens": 8}),
    (ResponsesRequest, {"model": "m", "input": "hi"}),
]


@pytest.mark.parametrize("cls, body", BODIES)
def test_a_call_without_temperature_gets_the_models_default(cls, body):
    unset = cls.model_validate(body)
    assert _sampling(unset, "temperature", 0.2) == 0.2
    assert _sampling(unset, "top_p", 0.9) == 0.9
    assert _sampling(unset, "temperature", None) == 1.0  # no model default: the API's


@pytest.mark.parametrize("cls, body", BODIES)
def test_a_callers_own_value_wins(cls, body):
    set_ = cls.model_validate({**body, "temperature": 0.7, "top_p": 0.5})
    assert _sampling(set_, "temperature", 0.2) == 0.7
    assert _sampling(set_, "top_p", 0.9) == 0.5


def test_model_settings_parse_and_are_bounded():
    m = ModelConfig(
        name="m", temperature=0.2, top_p=0.9, dtype="bfloat16", chat_template="chatml-tools"
    )
    assert (m.temperature, m.top_p, m.dtype, m.chat_template) == (
        0.2,
        0.9,
        "bfloat16",
        "chatml-tools",
    )
    for bad in ({"temperature": -1}, {"top_p": 0}, {"dtype": "float16"}):
        with pytest.raises(ValueError):
            ModelConfig(name="m", **bad)
