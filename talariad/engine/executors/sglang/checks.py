"""check-config lines for `executor: sglang` instances: one line per missing piece.

They read the parsed YAML (plain dicts), so they run alongside the schema check; malformed parts
are the schema's to report.
"""

from __future__ import annotations

import importlib.util

SGLANG_VERSION = "0.5.23"
"""The SGLang release whose control surface this executor is built and verified against."""


def sglang_importable() -> bool:
    return importlib.util.find_spec("sglang") is not None


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _consecutive(devices: list) -> bool:
    return all(isinstance(d, int) for d in devices) and devices == list(
        range(devices[0], devices[0] + len(devices))
    )


def _server_lines(where: str, url, pool, devices) -> list[tuple[str, str]]:
    """A server the operator runs (`sglang.url`), or the GPU group one is launched on."""
    out = []
    if url is not None:
        if pool != "hot":
            out.append(
                (
                    f"{where}.sglang.url",
                    "only a hot instance may use a server the operator runs "
                    "(a cold instance releases and resumes its own servers)",
                )
            )
        if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            out.append((f"{where}.sglang.url", f"expected http://host:port, got {url!r}"))
    elif devices == "cpu":
        out.append(
            (
                f"{where}.devices",
                "the sglang executor runs on GPUs: list the CUDA device ids of "
                "this instance's tensor-parallel group (e.g. [0, 1, 2, 3])",
            )
        )
    elif isinstance(devices, list) and devices and not _consecutive(devices):
        out.append(
            (
                f"{where}.devices",
                f"SGLang takes a group as --base-gpu-id and --tp-size: the ids must "
                f"be consecutive, got {devices}",
            )
        )
    return out


def config_problems(data: dict, i: int) -> list[tuple[str, str]]:
    """(field path, what is missing) for instance `i` of the config `data`, an sglang instance."""
    inst, where = data["instances"][i], f"instances[{i}]"
    sg = inst.get("sglang") if isinstance(inst.get("sglang"), dict) else {}
    url, pool, devices = sg.get("url"), inst.get("pool"), inst.get("devices", "cpu")
    out = []
    if url is None and sg.get("launch_command") is None and not sglang_importable():
        out.append(
            (
                f"{where}.executor",
                f"executor 'sglang' needs the Python package 'sglang', which is not "
                f"installed: install the gpu extra (pip install 'talaria[gpu]', which "
                f"pins sglang=={SGLANG_VERSION}), or set sglang.launch_command or "
                f"sglang.url",
            )
        )
    out += _server_lines(where, url, pool, devices)
    if sg.get("kv_host") == "storage" and pool != "cold":
        out.append(
            (
                f"{where}.sglang.kv_host",
                "storage keeps KV across model switches: a cold instance only",
            )
        )
    models = [m for m in _list(data.get("models")) if isinstance(m, dict)]
    for name in _list(inst.get("models")):
        j = next((k for k, m in enumerate(models) if m.get("name") == name), None)
        if j is not None and models[j].get("path") is None:
            out.append(
                (
                    f"models[{j}].path",
                    f"model {name!r} is served by sglang instance {inst.get('name')!r}: "
                    f"give the checkpoint directory SGLang loads (path:)",
                )
            )
    return out
