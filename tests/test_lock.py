"""requirements/lock.txt holds every package at one version: it admits what
pyproject.toml asks for, and it is what this environment runs (./dev installs
with it as constraints), so a clone next month tests what this one did."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name.split("[")[0])] = version.split(";")[0].strip()
    return pins


def asked_for() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [
        Requirement(text) for text in [*project["dependencies"], *(r for rs in extras.values() for r in rs)]
    ]


def test_the_lock_admits_what_pyproject_asks_for() -> None:
    pins = locked()
    unmet = [
        str(requirement)
        for requirement in asked_for()
        if canonicalize_name(requirement.name) not in pins
        or pins[canonicalize_name(requirement.name)] not in requirement.specifier
    ]
    assert unmet == [], "run ./dev lock"


def test_what_runs_is_what_is_locked() -> None:
    pins = locked()
    drifted = {
        name: (metadata.version(name), pins[name])
        for name in (canonicalize_name(r.name) for r in asked_for())
        if metadata.version(name) != pins[name]
    }
    assert drifted == {}
