"""The GGUF reader on small files the tests write: every supported block type against ggml's
scalar loops, a tiny Llama back to its exact weights, tokenizer and template, and one-line
refusals for what it cannot serve."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from talariad.engine.executors.torch_engine.hosted import load_hosted
from talariad.engine.model import ModelRunner, SamplingParams, tiny_config
from talariad.engine.model.gguf import GGML_TYPES, GGUFFile, dequantize
from talariad.engine.model.gguf_model import gguf_problem, load_gguf, permute, unpermute
from talariad.engine.model.tokenizer import FALLBACK_CHAT_TEMPLATE
from talariad.modelfiles import model_path_problem, resolve_model_path
from tests.engine.gguf_writer import F16, Q8_0, ref_block, tiny_llama_gguf

CONFIG = tiny_config()


def _random_blocks(kind, n: int, rng) -> np.ndarray:
    raw = rng.integers(0, 256, size=(n, kind.nbytes), dtype=np.uint8)
    scales = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}
    for at in scales[kind.name]:  # finite fp16 scales
        raw[:, at : at + 2] = np.frombuffer(
            rng.uniform(-2, 2, n).astype(np.float16).tobytes(), np.uint8
        ).reshape(n, 2)
    return raw


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_block_types_match_ggml_scalar_dequantization(name):
    ttype, kind = next((t, k) for t, k in GGML_TYPES.items() if k.name == name)
    blocks = _random_blocks(kind, 3, np.random.default_rng(ttype))
    got = dequantize(blocks.reshape(-1), ttype)
    want = np.concatenate([ref_block(name, bytes(b)) for b in blocks])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_float_types_are_exact():
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    bf = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert np.array_equal(dequantize(x.view(np.uint8), 0), x)
    assert np.array_equal(dequantize(x.astype(np.float16).view(np.uint8), 1), x.astype(np.float16))
    assert np.array_equal(
        dequantize((bf.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8), 30), bf
    )


def test_permute_round_trips():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)
    assert np.array_equal(unpermute(permute(w, 3), 3), w)
    assert not np.array_equal(permute(w, 3), w)


def test_tiny_llama_reads_back_exactly(tmp_path):
    path, params = tiny_llama_gguf(tmp_path / "tiny.gguf", CONFIG, seed=3)
    ck = load_gguf(path)
    c = ck.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (2, 4, 2)
    assert c.tie_word_embeddings is False and c.eos_token_ids == (2,)
    assert ck.params.keys() == params.keys()
    for name, w in params.items():  # q/k come back in rotate-half order
        assert torch.equal(ck.params[name], w), name
    tok = ck.tokenizer
    text = "Hello world! 12345 apples.\n  def main():"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") == [2] and tok.special["eos_token"] == "<|im_end|>"
    assert tok.chat_template == FALLBACK_CHAT_TEMPLATE


def test_quantized_and_half_tensors_dequantize_to_the_model_dtype(tmp_path):
    types = {"token_embd.weight": Q8_0, "blk.0.ffn_up.weight": F16}
    path, params = tiny_llama_gguf(tmp_path / "q.gguf", CONFIG, types=types)
    ck = load_gguf(path, torch.bfloat16)
    assert {t.dtype for t in ck.params.values()} == {torch.bfloat16}
    emb, want = ck.params["model.embed_tokens.weight"].float(), params["model.embed_tokens.weight"]
    assert (emb - want).abs().max() <= want.abs().max() / 127  # Q8_0: one step of its scale


def test_a_gguf_model_serves_greedy_tokens_like_its_weights(tmp_path):
    path, params = tiny_llama_gguf(tmp_path / "tiny.gguf", CONFIG, seed=3)
    hosted = load_hosted("g", path=path, profile=None, seed=None, device="cpu", chat_template="X")
    assert hosted.tokenizer.chat_template == "X"
    ids = hosted.tokenizer.encode("The quick brown fox")
    a = ModelRunner(hosted.config, hosted.params, num_pages=8, page_size=16)
    b = ModelRunner(CONFIG, params, num_pages=8, page_size=16)
    sp = SamplingParams(max_tokens=6)
    assert a.generate(ids, sp).token_ids == b.generate(ids, sp).token_ids


@pytest.mark.parametrize(
    "meta, tensor_type, words",
    [
        ({"general.architecture": "gemma"}, None, "architecture 'gemma' is not supported"),
        ({}, 13, "tensor token_embd.weight is Q5_K, which is not supported"),
        ({"tokenizer.ggml.model": "llama"}, None, "tokenizer model 'llama' is not supported"),
        ({"tokenizer.ggml.pre": "qwen2"}, None, "pre-tokenizer 'qwen2' is not supported"),
    ],
)
def test_what_it_cannot_serve_is_refused_in_one_line(tmp_path, meta, tensor_type, words):
    path, _ = tiny_llama_gguf(tmp_path / "bad.gguf", CONFIG, **meta)
    if tensor_type is not None:  # relabel the embedding's type in place: same size as F32 here
        data = bytearray(path.read_bytes())
        g = GGUFFile(path)
        name = b"token_embd.weight"
        at = data.index(name, 0, g.data_start) + len(name) + 4 + 8 * 2
        data[at : at + 4] = tensor_type.to_bytes(4, "little")
        path.write_bytes(bytes(data))
    problem = gguf_problem(path)
    assert problem is not None and words in problem and "\n" not in problem
    with pytest.raises(ValueError, match=words.split(" ")[0]):
        load_gguf(path)


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"nope" * 10)
    assert "is not a GGUF file" in gguf_problem(tmp_path / "x.gguf")


def test_pkg_paths_name_files_of_installed_distributions(tmp_path):
    found = resolve_model_path("pkg:pytest/pytest/__init__.py", None)
    assert found.is_file() and found.name == "__init__.py"
    with pytest.raises(ValueError, match="package 'no-such-dist' is not installed"):
        resolve_model_path("pkg:no-such-dist/x.gguf", None)
    with pytest.raises(ValueError, match="has no file 'nope.gguf'"):
        resolve_model_path("pkg:pytest/nope.gguf", None)
    path, _ = tiny_llama_gguf(tmp_path / "ok.gguf", CONFIG)
    assert model_path_problem("ok.gguf", tmp_path) is None
    assert "no such GGUF file" in model_path_problem("gone.gguf", tmp_path)


def test_a_config_model_gets_its_path_dtype_and_template(tmp_path):
    from talariad.checks import parse_checked
    from talariad.config import ConfigError
    from talariad.engine.executors.torch_engine.factory import load_models

    tiny_llama_gguf(tmp_path / "m.gguf", CONFIG)
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    models = [
        {"name": "a", "path": "m.gguf", "dtype": "bfloat16", "chat_template": "t.jinja"},
        {"name": "b", "path": "m.gguf", "chat_template": "chatml-tools"},
    ]
    inst = {"name": "c", "pool": "cold", "executor": "torch", "models": ["a", "b"]}
    data = {"models": models, "instances": [inst]}
    cfg = parse_checked(data, "t", tmp_path)
    hosted = load_models(cfg, cfg.instances[0], "cpu", tmp_path)
    assert hosted["a"].dtype == torch.bfloat16 and hosted["b"].dtype == torch.float32
    assert hosted["a"].tokenizer.render_chat([{"role": "user", "content": "hi"}]) == "hi"
    assert hosted["b"].tokenizer.chat_template == FALLBACK_CHAT_TEMPLATE
    tiny = load_hosted("t", path=None, profile="tiny", seed=1, device="cpu", chat_template="T")
    assert tiny.tokenizer.chat_template == "T"
    assert (
        load_hosted("u", path=None, profile="tiny", seed=1, device="cpu").tokenizer.chat_template
        != "T"
    )
    models[0]["chat_template"] = "gone.jinja"
    models[1]["path"] = "gone.gguf"
    with pytest.raises(ConfigError) as err:
        parse_checked(data, "t", tmp_path)
    assert "models[0].chat_template: 'gone.jinja' is neither" in str(err.value.lines)
    assert "models[1].path: 'gone.gguf': no such GGUF file" in str(err.value.lines)


def test_check_config_names_what_a_gguf_model_cannot_serve(tmp_path):
    from typer.testing import CliRunner

    from talariad.cli import app

    tiny_llama_gguf(tmp_path / "g.gguf", CONFIG, **{"general.architecture": "gemma"})
    cfg = {
        "models": [{"name": "g", "path": "g.gguf"}],
        "instances": [{"name": "h", "pool": "hot", "executor": "torch", "models": ["g"]}],
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(app, ["check-config", str(tmp_path / "t.yaml")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"talariad: {tmp_path / 't.yaml'}: models[0].path: g.gguf: architecture 'gemma' is not "
        "supported (supported: llama, qwen2)"
    ]
