"""Per-model settings of the torch engine: sampling defaults for calls that set none, the chat
template and dtype a model is served with."""

from __future__ import annotations

import pytest

from talariad.calls.dialects import chat, messages, responses
from talariad.calls.store import ResponseStore
from talariad.config import ModelConfig
from talariad.gateway.call import _sampling

MSG = [{"role": "user", "content": "hi"}]
BODIES = [
    (chat.ChatCompletionRequest, chat.spec, {"model": "m", "messages": MSG}),
    (messages.MessagesRequest, messages.spec, {"model": "m", "messages": MSG, "max_tokens": 8}),
    (
        responses.ResponsesRequest,
        lambda body: responses.spec(body, ResponseStore(0))[0],
        {"model": "m", "input": "hi"},
    ),
]


@pytest.mark.parametrize("cls, spec, body", BODIES)
def test_a_call_without_temperature_gets_the_models_default(cls, spec, body):
    unset = spec(cls.model_validate(body))
    assert unset.temperature is None and unset.top_p is None  # the client sent none
    assert _sampling(unset.temperature, 0.2) == 0.2
    assert _sampling(unset.top_p, 0.9) == 0.9
    assert _sampling(unset.temperature, None) == 1.0  # no model default: the APIs'


@pytest.mark.parametrize("cls, spec, body", BODIES)
def test_a_callers_own_value_wins(cls, spec, body):
    set_ = spec(cls.model_validate({**body, "temperature": 0.7, "top_p": 0.5}))
    assert _sampling(set_.temperature, 0.2) == 0.7
    assert _sampling(set_.top_p, 0.9) == 0.5


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
