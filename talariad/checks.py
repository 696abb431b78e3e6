"""The run-time checks of a config: what the schema (`config.py`) cannot see without the rest of
the house (router policies, latency profiles, executors and devices, checkpoints, the machine's
memory, API keys). `check-config`, `run`, a reload and the simulator all come through here, so
they refuse the same things with the same lines."""

from __future__ import annotations

import os
import pathlib

from talariad.config import (
    GIB,
    ConfigError,
    TalariaConfig,
    as_list,
    read_config_data,
    schema_lines,
)
from talariad.secretfiles import load_keys, load_token


def load_checked(path: str | pathlib.Path, serving: bool = True) -> TalariaConfig:
    """The config at `path`; ConfigError with every problem of the file, one line each.
    `serving`: also refuse what could never serve (`serving_lines`)."""
    path = pathlib.Path(path)
    return parse_checked(read_config_data(path), str(path), path.resolve().parent, serving)


def parse_checked(
    data: object, source: str, base_dir: pathlib.Path | None = None, serving: bool = False
) -> TalariaConfig:
    """Already-parsed config data through the schema and the run-time checks in one pass.
    `base_dir`: where relative model paths start (the file's folder); None skips the checkpoint
    and API keys checks."""
    cfg, problems = schema_lines(data)
    if isinstance(data, dict):
        seen = set(problems)
        problems += [p for p in _policy_lines(data) + _build_lines(data, base_dir) if p not in seen]
    if cfg is not None and not problems and serving and base_dir is not None:
        problems = serving_lines(cfg, base_dir)
    if problems:
        raise ConfigError([f"{source}: {p}: {m}" for p, m in problems])
    return cfg


def _policy_lines(data: dict) -> list[tuple[str, str]]:
    policy = data.get("policy") if isinstance(data.get("policy"), dict) else {}
    valid = _policy_names()
    if isinstance(policy.get("router"), str) and policy["router"] not in valid:
        return [
            ("policy.router", f"unknown policy {policy['router']!r} (valid: {', '.join(valid)})")
        ]
    return []


def _build_lines(data: dict, base_dir: pathlib.Path | None) -> list[tuple[str, str]]:
    """What `run` would fail on when it builds the instances: a profile no bundled set defines, an
    executor this build cannot run, devices it cannot use, a checkpoint directory that is not
    there (relative to `base_dir`, the config file's folder)."""
    from talariad.engine.build import executor_problem
    from talariad.perfmodel.profiles import available, find_model

    problems = []
    for i, m in enumerate(as_list(data.get("models"))):
        name = m.get("profile", "tiny") if isinstance(m, dict) else None
        if isinstance(name, str) and find_model(name) is None:
            problems.append(
                (
                    f"models[{i}].profile",
                    f"no bundled latency profile named {name!r} (sets: {', '.join(available())})",
                )
            )
    for i, inst in enumerate(as_list(data.get("instances"))):
        if not isinstance(inst, dict) or not isinstance(inst.get("executor", "sim"), str):
            continue
        found = executor_problem(inst.get("executor", "sim"), inst.get("devices", "cpu"))
        if found is not None:
            problems.append((f"instances[{i}].{found[0]}", found[1]))
        if inst.get("executor") == "sglang":
            from talariad.engine.executors.sglang.checks import config_problems

            problems += config_problems(data, i)
    return problems + _checkpoint_lines(data, base_dir)


def _checkpoint_lines(data: dict, base_dir: pathlib.Path | None) -> list[tuple[str, str]]:
    """A `path` a torch instance would load must be a checkpoint directory (config.json), a GGUF
    file it can serve, or a `pkg:` file of an installed distribution (talariad/modelfiles.py)."""
    if base_dir is None:
        return []
    from talariad.modelfiles import chat_template_problem, model_path_problem

    torch_models = {
        m
        for inst in as_list(data.get("instances"))
        if isinstance(inst, dict) and inst.get("executor") == "torch"
        for m in as_list(inst.get("models"))
    }
    problems = []
    for i, m in enumerate(as_list(data.get("models"))):
        path = m.get("path") if isinstance(m, dict) else None
        if isinstance(path, str) and m.get("name") in torch_models:
            problem = model_path_problem(path, base_dir)
            if problem is not None:
                problems.append((f"models[{i}].path", problem))
        template = m.get("chat_template") if isinstance(m, dict) else None
        if isinstance(template, str) and m.get("name") in torch_models:
            problem = chat_template_problem(template, base_dir)
            if problem is not None:
                problems.append((f"models[{i}].chat_template", problem))
    return problems


def machine_memory_gib() -> float:
    """Physical memory of this machine in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def serving_lines(
    cfg: TalariaConfig, config_dir: pathlib.Path, machine_gib: float | None = None
) -> list[tuple[str, str]]:
    """What makes a valid config unable to serve: a model no instance serves, host KV the machine
    cannot hold, a device buffer smaller than a model, an API keys file `run` cannot read.
    `check-config` and `run` both refuse on these (exit 2)."""
    machine_gib = machine_memory_gib() if machine_gib is None else machine_gib
    problems = _unserved_lines(cfg) + _memory_lines(cfg, machine_gib)
    for name, load in ((cfg.listen.api_keys_file, load_keys), (cfg.pool.token_file, load_token)):
        if not name:
            continue
        try:
            load(config_dir / name)
        except ValueError as err:  # its message starts with the field's name
            problems.append(tuple(str(err).split(": ", 1)))
    return problems


def _unserved_lines(cfg: TalariaConfig) -> list[tuple[str, str]]:
    served = {m for inst in cfg.instances for m in inst.models}
    return [
        (
            f"models[{i}].name",
            f"no instance serves {m.name!r}: add it to an instance's models or remove it "
            "(/ready would stay 503)",
        )
        for i, m in enumerate(cfg.models)
        if m.name not in served
    ]


def _memory_lines(cfg: TalariaConfig, machine_gib: float) -> list[tuple[str, str]]:
    """torch instances: host KV within the machine's memory, a device buffer that holds each model."""
    torch = [(i, inst) for i, inst in enumerate(cfg.instances) if inst.executor == "torch"]
    problems, too_big = [], False
    for i, inst in torch:
        if inst.host_kv_gib > machine_gib:
            too_big = True
            problems.append(
                (
                    f"instances[{i}].host_kv_gib",
                    f"{inst.host_kv_gib:g} GiB is more than this machine's memory "
                    f"({machine_gib:.3g} GiB)",
                )
            )
        largest = max((cfg.model(m) for m in inst.models), key=lambda m: m.size_gib)
        if inst.memory_gib is not None and inst.memory_gib < largest.size_gib:
            problems.append(
                (
                    f"instances[{i}].memory_gib",
                    f"{inst.memory_gib:g} GiB is below the size_gib of {largest.name!r} "
                    f"({largest.size_gib:g} GiB): its weights can never be loaded",
                )
            )
    total = sum(inst.host_kv_gib for _, inst in torch)
    if not too_big and total > machine_gib:  # each fits alone, not all together
        problems.append(
            (
                "instances",
                f"host_kv_gib of the torch instances adds up to {total:g} GiB, "
                f"more than this machine's memory ({machine_gib:.3g} GiB)",
            )
        )
    return problems


def _policy_names() -> list[str]:
    from talariad.router import POLICIES

    return sorted(POLICIES.names())
