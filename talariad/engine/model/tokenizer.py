"""TextTokenizer: tokenizer.json (via `tokenizers`) plus the chat template and special tokens.

The chat template comes from `chat_template.jinja` or tokenizer_config.json's `chat_template`
and is rendered with jinja2 (sandboxed, as Hugging Face does). Without a template, or without
jinja2, FALLBACK_CHAT_TEMPLATE (ChatML) is used in plain Python.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:  # pragma: no cover - jinja2 ships in the venv
    jinja2 = None

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more of the functions described below (JSON Schema).\n<tools>\n"
)
TOOLS_INSTRUCTIONS = (
    '</tools>\n\nTo call a function, answer with a JSON object holding "name" and "arguments" '
    "between <tool_call> and </tool_call> tags, one pair per call."
)
FALLBACK_CHAT_TEMPLATE = (
    # ChatML with tools in the Hermes/Qwen manner: definitions in the first system turn, calls as
    # <tool_call> JSON in the assistant turn, results as <tool_response> in a user turn
    "{% set ns = namespace(first=0) %}"
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% set ns.first = 1 %}{% endif %}"
    + TOOLS_PREAMBLE
    + "{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    + TOOLS_INSTRUCTIONS
    + "<|im_end|>\n{% endif %}"
    "{% for m in messages[ns.first:] %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}{{ '\\n<tool_call>\\n' }}"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A session calls a model, waits for a tool, "
    "and returns with a longer prompt. Paged attention keeps keys and values in fixed pages. "
    "Hello world! How are you today? I am fine, thank you. What is the weather like? "
    "def main():\n    return 0\n 0123456789 + - * / = ( ) [ ] { } , . ; : ' \" ? !"
)


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, special: dict[str, str]):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special = special
        """Special-token strings from tokenizer_config.json (bos_token, eos_token, ...)."""

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ValueError(f"tokenizer.json not found in {path}")
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as e:  # the Rust side raises a bare Exception
            raise ValueError(f"cannot read {tok_file}: {e}") from None
        cfg = read_json(path / "tokenizer_config.json")
        return cls(tokenizer, _find_template(path, cfg), _special_tokens(cfg))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.tokenizer.token_to_id(token)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text; `tools` (chat-template form) go wherever the template puts them."""
        template = self.chat_template or FALLBACK_CHAT_TEMPLATE
        if jinja2 is None:
            return _render_fallback(messages, add_generation_prompt, tools)
        try:
            return (
                _jinja_env()
                .from_string(template)
                .render(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    tools=tools or None,
                    **self.special,
                )
            )
        except (
            jinja2.TemplateError
        ) as e:  # a conversation the template refuses is the client's mistake
            raise ValueError(f"chat template error: {e}") from None

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ):
        return self.encode(self.render_chat(messages, add_generation_prompt, tools))


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _find_template(path: Path, cfg: dict[str, Any]) -> str | None:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _special_tokens(cfg: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = cfg.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[key] = value
    return out


def _jinja_env():
    def raise_exception(message: str):
        raise ValueError(f"chat template error: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # Llama 3 templates
    return env


def _render_fallback(
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """FALLBACK_CHAT_TEMPLATE in plain Python (the same text, for a build without jinja2)."""
    text, first = "", 0
    if tools:
        head = ""
        if messages and messages[0]["role"] == "system":
            head, first = messages[0]["content"] + "\n\n", 1
        defs = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tools)
        text = f"<|im_start|>system\n{head}{TOOLS_PREAMBLE}{defs}{TOOLS_INSTRUCTIONS}<|im_end|>\n"
    for m in messages[first:]:
        if m["role"] == "tool":
            text += (
                f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>\n"
            )
            continue
        calls = "".join(
            "\n<tool_call>\n"
            + json.dumps(
                {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                ensure_ascii=False,
            )
            + "\n</tool_call>"
            for c in m.get("tool_calls") or []
        )
        text += f"<|im_start|>{m['role']}\n{m['content']}{calls}<|im_end|>\n"
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def build_tiny_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A byte-level BPE trained on a small built-in text (any input encodes; nothing downloaded)."""
    minimum = 256 + len(TINY_SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} must be >= {minimum} for a byte-level tokenizer")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TINY_CORPUS] * 4, trainer=trainer)
    return tok
