"""The simulator runs an operator's config: the same config -> knobs mapping as the daemon."""

from __future__ import annotations

import json
import pathlib

from talariad.config import load_config
from talariad.knobs import config_router_knobs, config_sched_knobs
from talariad.perfmodel.profiles import load_set
from talariad.sim.__main__ import main
from talariad.sim.configs import ablation_configs, config_models, from_config, map_models

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAPER = ROOT / "etc" / "examples" / "paper-tp8.yaml"


def test_the_bundled_paper_config_is_the_builtin_ablation_suite():
    cfg = load_config(PAPER)
    mine, _ = from_config(cfg, "ablations")
    models = tuple(m.name for m in cfg.models)
    builtin = ablation_configs(load_set("paper-tp8"), models)
    assert [c.name for c in mine] == [c.name for c in builtin]
    for a, b in zip(mine, builtin, strict=False):
        assert (a.sched, a.router, a.policy, a.heartbeat_s, a.prewarm) == (
            b.sched,
            b.router,
            b.policy,
            b.heartbeat_s,
            b.prewarm,
        )
        assert [(i.models, i.pool) for i in a.instances] == [
            (i.models, i.pool) for i in b.instances
        ]


def test_daemon_and_simulator_knobs_agree_on_the_default_config():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    sim = from_config(cfg, "ablations")[0][0]
    assert sim.router == config_router_knobs(cfg)
    assert sim.sched == config_sched_knobs(cfg, sim.sched.kv_capacity_tokens)
    assert sim.router.replica_penalty_s == cfg.policy.replica_penalty_s == 2.0


def test_trace_models_the_config_does_not_serve_are_mapped_onto_it():
    cfg = load_config(ROOT / "etc" / "talaria.yaml")
    assert map_models(["a", "tiny-code", "b"], config_models(cfg)) == {
        "a": "smol-chat",  # the hot instance's model comes first
        "tiny-code": "tiny-code",
        "b": "tiny-chat",  # the spare served models in config order
    }


def _trace(path, models: tuple[str, ...], sessions: int):
    """`sessions` sessions of 3 calls each, session s on models[s % len(models)]."""
    rows = [
        json.dumps(
            {
                "session_id": f"s{s}",
                "call_idx": k,
                "model": models[s % len(models)],
                "prompt_tokens": 1000 + 500 * k,
                "prefix_tokens": 0 if k == 0 else 900 + 500 * (k - 1),
                "output_tokens": 20,
                "gap_s": 0.4 if k else 0,
            }
        )
        for s in range(sessions)
        for k in range(3)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_compare_runs_the_default_config(tmp_path, capsys):
    trace = _trace(tmp_path / "t.jsonl", ("qwen3-235b",), 3)
    argv = [
        "compare",
        "--config",
        str(ROOT / "etc" / "talaria.yaml"),
        "--trace",
        str(trace),
        "--suite",
        "ablations",
        "--no-progress",
        "--width",
        "200",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "qwen3-235b -> smol-chat" in out and "Round-only" in out


def test_compare_with_a_bad_config_is_one_line_per_problem(tmp_path, capsys):
    bad = tmp_path / "t.yaml"
    bad.write_text(
        "models: [{name: a, profile: nope}]\ninstances: [{name: i, pool: cold, models: [a]}]\n"
    )
    assert main(["compare", "--config", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "models[0].profile" in err[0]


def test_the_router_suite_runs_on_the_default_config_whose_hot_instance_hosts_one_model(
    tmp_path, capsys
):
    # two trace models: one lands on tiny-chat, which the hot instance does not host; counting
    # avoidable opens asks every other instance whether it holds that model
    trace = _trace(tmp_path / "t.jsonl", ("qwen3-235b", "glm5-nvfp4"), 4)
    argv = ["compare", "--config", str(ROOT / "etc" / "talaria.yaml"), "--trace", str(trace)]
    assert main([*argv, "--suite", "router", "--no-progress", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "-> tiny-chat" in out and "talaria@high" in out


def test_an_instance_has_no_work_for_a_model_it_does_not_host():
    from talariad.cold_sched.calls import CallTable

    assert CallTable(["a"]).has_work("b") is False
