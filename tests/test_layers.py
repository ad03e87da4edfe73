"""app.py sits on top: no package of ours imports it. (import-linter, run by
./dev test, checks the layers below; it reads packages only, so this checks
the module on top.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_package_imports_the_app() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("store", "resolvers", "schema")
        for path in (ROOT / package).rglob("*.py")
        if "app" in imported_modules(path)
    ]
    assert offenders == []
