"""Checkpoints: a written tiny model loads through the real loader and reproduces its logits."""

from __future__ import annotations

import json
import math

import pytest
import torch

from talariad.engine.model import (
    ArchConfig,
    ModelRunner,
    PrefillSeq,
    kv_page_bytes,
    load_checkpoint,
    param_shapes,
    random_weights,
    tiny_config,
    write_checkpoint,
    write_tiny_checkpoint,
)
from talariad.engine.model.llama import rope_inv_freq
from talariad.engine.model.loader import INDEX_FILE
from talariad.engine.model.tokenizer import FALLBACK_CHAT_TEMPLATE, build_tiny_tokenizer
from tests.engine.model_reference import DEVICES, PROMPT, tol


def logits(config, params) -> torch.Tensor:
    runner = ModelRunner(config, params, num_pages=16, page_size=4)
    table = runner.allocator.allocate("r", len(PROMPT))
    return runner.prefill([PrefillSeq("r", PROMPT, 0, table)], all_logits=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize(
    "overrides", [{}, {"tie_word_embeddings": True}, {"model_type": "qwen2", "qkv_bias": True}]
)
def test_written_checkpoint_reproduces_in_memory_logits(tmp_path, device, shards, overrides):
    config = tiny_config(**overrides)
    write_tiny_checkpoint(tmp_path, config, seed=7, num_shards=shards)
    assert (tmp_path / INDEX_FILE).is_file() == (shards > 1)
    ckpt = load_checkpoint(tmp_path, device=device, dtype=torch.float32)
    assert ckpt.config == config
    want = random_weights(config, seed=7, device=device)
    assert ckpt.params.keys() == want.keys()
    assert ("lm_head.weight" in ckpt.params) != config.tie_word_embeddings
    torch.testing.assert_close(
        logits(ckpt.config, ckpt.params), logits(config, want), **tol(device)
    )


def test_tied_checkpoint_ignores_a_stored_lm_head_and_untied_needs_one(tmp_path):
    tied = tiny_config(tie_word_embeddings=True)
    params = random_weights(tiny_config(), seed=1)  # includes lm_head.weight
    write_checkpoint(tmp_path / "tied", tied, params, build_tiny_tokenizer())
    assert "lm_head.weight" not in load_checkpoint(tmp_path / "tied").params
    untied = tiny_config()
    del params["lm_head.weight"]
    write_checkpoint(tmp_path / "untied", untied, params, build_tiny_tokenizer())
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_checkpoint(tmp_path / "untied")


def test_tokenizer_round_trip_and_chat_template(tmp_path):
    tok = load_checkpoint(write_tiny_checkpoint(tmp_path)).tokenizer
    text = "Hello world, wörld 😀 and unseen words"
    assert tok.decode(tok.encode(text)) == text
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode_chat(messages)
    assert ids[0] == tok.token_id("<|im_start|>") and tok.token_id("<|im_end|>") in ids


def test_chat_template_from_tokenizer_config_and_jinja_file(tmp_path):
    path = write_tiny_checkpoint(tmp_path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"
    )
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_checkpoint(path).tokenizer
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "[user]x<|im_end|>"
    (path / "chat_template.jinja").write_text("{{ messages | length }} messages")
    assert (
        load_checkpoint(path).tokenizer.render_chat([{"role": "a", "content": ""}] * 2)
        == "2 messages"
    )


def test_missing_chat_template_falls_back_to_chatml(tmp_path):
    path = write_tiny_checkpoint(tmp_path)
    (path / "tokenizer_config.json").unlink()
    tok = load_checkpoint(path).tokenizer
    assert tok.chat_template is None
    assert tok.render_chat([{"role": "user", "content": "x"}], add_generation_prompt=False) == (
        "<|im_start|>user\nx<|im_end|>\n"
    )
    assert "im_start" in FALLBACK_CHAT_TEMPLATE


def test_generation_config_overrides_eos(tmp_path):
    path = write_tiny_checkpoint(tmp_path)
    assert load_checkpoint(path).config.eos_token_ids == (2, 0)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    assert load_checkpoint(path).config.eos_token_ids == (5, 6)


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hidden_size": None}, "missing required field.*hidden_size"),
        ({"model_type": "gpt2"}, "model_type='gpt2'"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
        ({"vocab_size": "many"}, "vocab_size='many'"),
        ({"rope_scaling": {"type": "yarn", "factor": 2}}, "rope_scaling type 'yarn'"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"vocab_size": 300}, "tokenizer has 320 tokens but vocab_size=300"),
        ({"intermediate_size": 100}, "wrong shape.*mlp"),
    ],
)
def test_bad_config_is_a_clear_value_error(tmp_path, changes, message):
    path = write_tiny_checkpoint(tmp_path)
    _edit_config(path, **changes)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(path)


def test_broken_directories_are_clear_value_errors(tmp_path):
    with pytest.raises(ValueError, match="directory not found"):
        load_checkpoint(tmp_path / "nope")
    path = write_tiny_checkpoint(tmp_path / "m")
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_checkpoint(path)
    path = write_tiny_checkpoint(tmp_path / "w")
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_checkpoint(path)
    path = write_tiny_checkpoint(tmp_path / "c")
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read model.safetensors"):
        load_checkpoint(path)
    path = write_tiny_checkpoint(tmp_path / "t")
    (path / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer.json not found"):
        load_checkpoint(path)
    path = write_tiny_checkpoint(tmp_path / "s", num_shards=2)
    next(path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(ValueError, match="missing shard"):
        load_checkpoint(path)


def test_config_round_trip_and_derived_head_dim():
    for config in (
        tiny_config(),
        tiny_config(model_type="qwen2", qkv_bias=True),
        tiny_config(eos_token_ids=(4,)),
    ):
        assert ArchConfig.from_dict(config.to_dict()) == config
    cfg = tiny_config().to_dict()
    del cfg["head_dim"]
    assert ArchConfig.from_dict(cfg).head_dim == 64 // 4
    assert ArchConfig.from_dict({**cfg, "num_key_value_heads": None}).num_key_value_heads == 4


def test_llama3_rope_scaling_slows_only_long_wavelengths():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    plain = rope_inv_freq(tiny_config())
    scaled = rope_inv_freq(tiny_config(rope_scaling=scaling))
    assert scaled[0] == plain[0]  # highest frequency untouched
    torch.testing.assert_close(scaled[-1], plain[-1] / 8)
    with pytest.raises(ValueError, match="low_freq_factor"):
        tiny_config(rope_scaling={"rope_type": "llama3", "factor": 8.0})


LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 21,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
}


def test_real_world_config_shapes_parse():
    llama = ArchConfig.from_dict(LLAMA_3_2_1B)
    assert (llama.head_dim, llama.num_query_groups, llama.qkv_bias) == (64, 4, False)
    assert llama.eos_token_ids == (128001,) and "lm_head.weight" not in param_shapes(llama)
    qwen = ArchConfig.from_dict(QWEN2_5_0_5B)
    assert (qwen.head_dim, qwen.qkv_bias, qwen.o_bias) == (64, True, False)
    shapes = param_shapes(qwen)
    assert shapes["model.layers.0.self_attn.k_proj.bias"] == (128,)
    n = sum(math.prod(s) for s in shapes.values())
    assert 490e6 < n < 500e6  # Qwen2.5-0.5B has 494M parameters
    assert kv_page_bytes(qwen, 16, torch.bfloat16) == 24 * 2 * 2 * 64 * 16 * 2
