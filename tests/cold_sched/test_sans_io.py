"""The cores are sans-IO: the router, the cold-pool scheduler and the instance core import no clock,
IO, process, thread or tensor module, directly or through what they import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import talariad

pytestmark = pytest.mark.proc

PACKAGE = Path(talariad.__file__).parent
PURE = {
    "__future__",
    "abc",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "hashlib",
    "heapq",
    "itertools",
    "math",
    "random",
    "types",
    "typing",
    "talariad",
}
CORES = ("router", "cold_sched", "instance")
NEVER = (
    "torch",
    "asyncio",
    "subprocess",
    "concurrent",
    "httpx",
    "fastapi",
    "uvicorn",
    "grpc",
    "numpy",
    "pydantic",  # the cores return their own dataclasses; the shells encode them
    "talariad.wire",
)


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("core", CORES)
def test_core_modules_import_only_pure_modules(core):
    files = sorted((PACKAGE / core).rglob("*.py"))
    assert len(files) >= 4
    for path in files:
        assert imported_roots(path) <= PURE, path.name


def test_cores_pull_in_no_io_through_their_imports():
    code = (
        "import sys, talariad.router, talariad.cold_sched, talariad.instance, talariad.memory, "
        "talariad.tools, talariad.perfmodel.model; "
        f"print(sorted(m for m in {NEVER!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
