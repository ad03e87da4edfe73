"""app.py sits on top: no package of ours imports it. (import-linter, run by
./dev test, checks the layers below; it reads packages only, so this checks
the module on top.)"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


# Strawberry's internals, in one module ---------------------------------------------------

SEAM = ROOT / "schema" / "strawberry_internals.py"

# Strawberry's public API (docs/decisions.md, "Strawberry's public API, and its
# internals in one module"): what these packages' `__init__` export in `__all__`,
# and the names Strawberry's documentation imports from a module that has no
# `__all__` or leaves them out of it. Everything else of Strawberry's is the seam's.
PUBLIC_PACKAGES = (
    "strawberry",
    "strawberry.types",
    "strawberry.extensions",
    "strawberry.http",
    "strawberry.subscriptions",
    "strawberry.exceptions",
    "strawberry.schema",
    "strawberry.permission",
    "strawberry.scalars",
    "strawberry.tools",
)
DOCUMENTED = {"strawberry.asgi": {"GraphQL"}, "strawberry.exceptions": {"ConnectionRejectionError"}}


def public_names() -> dict[str, frozenset[str]]:
    names: dict[str, set[str]] = {
        module: set(importlib.import_module(module).__all__) for module in PUBLIC_PACKAGES
    }
    for module, documented in DOCUMENTED.items():
        names.setdefault(module, set()).update(documented)
    return {module: frozenset(found) for module, found in names.items()}


def _underscored(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_in(tree: ast.AST, *, on_self_only: bool = False) -> set[str]:
    """The underscored names a piece of code gives or reads as attributes,
    methods and fields (`on_self_only`: as attributes of `self` or `cls`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _underscored(node.attr):
            if not on_self_only or (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _underscored(node.name):
            found.add(node.name)
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _underscored(node.target.id)
        ):
            found.add(node.target.id)
    return found


@functools.cache
def strawberry_private_names() -> frozenset[str]:
    """Every underscored name of Strawberry's own code: its private attributes,
    methods and fields (an `Info`'s `_raw_info`, a schema's `_schema`, ...)."""
    import strawberry

    found: set[str] = set()
    for path in Path(strawberry.__file__).parent.rglob("*.py"):
        found |= _private_names_in(ast.parse(path.read_text()))
    return frozenset(found)


def reaches_into_strawberry(
    source: str, public: Mapping[str, frozenset[str]], private: frozenset[str]
) -> list[str]:
    """Where `source` names Strawberry's internals: an import from a module, or
    of a name, that is not public; an attribute of Strawberry's public modules
    that is not; one of Strawberry's underscored names, read from anything but
    `self` or `cls`, given as a keyword argument, or through `getattr`."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(source)):
        at = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        if isinstance(node, ast.Import):
            found += [
                (*at, f"import {alias.name}")
                for alias in node.names
                if alias.name.startswith("strawberry.") and alias.name not in public
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "strawberry" or node.module.startswith("strawberry."):
                allowed = public.get(node.module, frozenset())
                found += [
                    (*at, f"from {node.module} import {alias.name}")
                    for alias in node.names
                    if alias.name not in allowed
                ]
        elif isinstance(node, ast.Attribute):
            owner = node.value
            if node.attr in private and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append((*at, f".{node.attr}"))
            elif isinstance(owner, ast.Name) and owner.id == "strawberry" and not node.attr.startswith("__"):
                if node.attr not in public["strawberry"] and f"strawberry.{node.attr}" not in public:
                    found.append((*at, f"strawberry.{node.attr}"))
            elif (
                isinstance(owner, ast.Attribute)
                and isinstance(owner.value, ast.Name)
                and owner.value.id == "strawberry"
                and f"strawberry.{owner.attr}" in public
                and node.attr not in public[f"strawberry.{owner.attr}"]
            ):
                found.append((*at, f"strawberry.{owner.attr}.{node.attr}"))
        elif isinstance(node, ast.keyword) and node.arg in private:
            found.append((*at, f"{node.arg}="))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private
        ):
            found.append((*at, f'{node.func.id}(..., "{node.args[1].value}")'))
    return [f"line {line}: {what}" for line, _, what in sorted(found)]


OURS = ("app", "store", "resolvers", "schema", "tests", "bench")


def touches_strawberry_state(cls: type) -> set[str]:
    """The private names of the Strawberry classes `cls` derives from that our
    classes in its MRO (outside the seam) read, set or override on `self`."""
    theirs = [base for base in cls.__mro__ if base.__module__.split(".")[0] == "strawberry"]
    ours = [
        base
        for base in cls.__mro__
        if base.__module__.split(".")[0] in OURS and base.__module__ != "schema.strawberry_internals"
    ]
    if not theirs:
        return set()
    their_names: set[str] = set()
    for base in theirs:
        their_names |= {name for name in vars(base) if _underscored(name)}
        their_names |= {name for name in getattr(base, "__annotations__", {}) if _underscored(name)}
        with contextlib.suppress(OSError, TypeError):
            their_names |= _private_names_in(
                ast.parse(textwrap.dedent(inspect.getsource(base))), on_self_only=True
            )
    touched: set[str] = set()
    for base in ours:
        tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        touched |= _private_names_in(tree, on_self_only=True) & their_names
    return touched


def our_sources() -> list[Path]:
    paths = [ROOT / "app.py"]
    for package in ("store", "resolvers", "schema", "tests", "bench"):
        paths += sorted(path for path in (ROOT / package).rglob("*.py") if "node_modules" not in path.parts)
    return [path for path in paths if path != SEAM]


def test_strawberry_internals_are_named_in_one_module() -> None:
    """Only schema/strawberry_internals.py names what Strawberry does not make
    public (import-linter refuses its modules to the packages; this checks the
    names too, and app.py, tests/ and bench/)."""
    public, private = public_names(), strawberry_private_names()
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in our_sources()
        if (found := reaches_into_strawberry(path.read_text(), public, private))
    }
    assert offenders == {}, "use (or add to) schema/strawberry_internals.py instead"


def test_no_subclass_of_strawberry_touches_its_private_state() -> None:
    """A class of ours deriving from one of Strawberry's sets or reads none of
    its underscored attributes (the seam's base classes do it for them)."""
    offenders: dict[str, set[str]] = {}
    for path in sorted((ROOT / "schema").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(name)
        for value in vars(module).values():
            ours = (
                isinstance(value, type) and value.__module__ == name and name != "schema.strawberry_internals"
            )
            if ours and (touched := touches_strawberry_state(value)):
                offenders[f"{name}.{value.__qualname__}"] = touched
    assert offenders == {}, "use (or add to) schema/strawberry_internals.py instead"


PRIVATE_USES = """
import strawberry
import strawberry.schema.schema
from strawberry.types.graphql import OperationType
from strawberry.types import Info, StrawberryField
from strawberry.asgi import GraphQL, ASGIWebSocketAdapter
graphql_schema = schema._schema
raw = info._raw_info
handlers = schema.schema_converter._get_field_exception_handlers(field)
made = schema.config.info_class(_raw_info=raw, _field=field)
sent = getattr(execution_context, "_provided_operation_name", None)
kind = strawberry.types.graphql.OperationType
other = strawberry.schema.schema.Schema
"""


def test_the_checks_find_strawberry_internals() -> None:
    public, private = public_names(), strawberry_private_names()
    found = reaches_into_strawberry(PRIVATE_USES, public, private)
    assert [line.split(": ", 1)[1] for line in found] == [
        "import strawberry.schema.schema",
        "from strawberry.types.graphql import OperationType",
        "from strawberry.types import StrawberryField",
        "from strawberry.asgi import ASGIWebSocketAdapter",
        "._schema",
        "._raw_info",
        "._get_field_exception_handlers",
        "_raw_info=",
        "_field=",
        'getattr(..., "_provided_operation_name")',
        "strawberry.types.graphql",
        "strawberry.schema.schema",
    ]
    public_only = (
        "import strawberry\nfrom strawberry.types import Info\nx = strawberry.Schema\ny = self._own\n"
    )
    assert reaches_into_strawberry(public_only, public, private) == []

    from schema.strawberry_internals import OpenTelemetryBase

    class Traced(OpenTelemetryBase):  # as schema.observability.Tracing was
        def on_operation(self) -> Any:
            self._span_holder.clear()
            yield

    class Plain(OpenTelemetryBase):
        def on_operation(self) -> Any:
            self._mine = None
            yield

    assert touches_strawberry_state(Traced) == {"_span_holder"}
    assert touches_strawberry_state(Plain) == set()
