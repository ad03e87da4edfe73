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


WRITER = ROOT / "resolvers" / "domain" / "notifications.py"


def builds_notifications(path: Path) -> list[int]:
    """Lines that build a notification record, or name the notifications
    channel, outside the one writer: a call of `Notification(...)` (however it
    was imported) or a string "notifications" passed to `user_channel`."""
    tree = ast.parse(path.read_text())
    aliases = {"Notification"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "store.items":
            aliases |= {alias.asname or alias.name for alias in node.names if alias.name == "Notification"}
    lines: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if (name in aliases and isinstance(func, ast.Name)) or (name == "Notification" and owner == "items"):
            lines.append(node.lineno)
        if name == "user_channel" and any(
            isinstance(arg, ast.Constant) and arg.value == "notifications" for arg in node.args
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_writer_builds_notifications() -> None:
    """Every notification goes through `notifications.write`, which stamps its
    epoch, counts it and announces it: no other module of ours builds one (the
    schema's `Notification` type wraps a record, and is told apart by module)."""
    offenders = {
        str(path.relative_to(ROOT)): lines
        for package in ("store", "resolvers")
        for path in (ROOT / package).rglob("*.py")
        if path != WRITER and (lines := builds_notifications(path))
    }
    assert offenders == {}
    # The check itself finds the writer's own builders.
    assert builds_notifications(WRITER)


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md is the map: a module it does not name is one a
    reader cannot find from it."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    unnamed = [
        str(path.relative_to(ROOT))
        for package in ("store", "resolvers", "schema")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__init__.py" and f"{path.stem}.py" not in page and f"`{path.stem}`" not in page
    ]
    assert unnamed == []
