"""The scheduler core is sans-IO (DESIGN.md §3): no clock, IO, process or tensor imports."""

from __future__ import annotations

import ast
from pathlib import Path

import talariad.cold_sched

ALLOWED = {"__future__", "collections", "dataclasses", "enum", "math", "typing", "talariad"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_cold_sched_imports_only_pure_modules():
    package = Path(talariad.cold_sched.__file__).parent
    files = sorted(package.glob("*.py"))
    assert len(files) > 5
    for path in files:
        assert imported_roots(path) <= ALLOWED, path.name
