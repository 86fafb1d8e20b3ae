"""The tested environment: constraints.txt pins every package pyproject.toml asks for, within its ranges, and a record
names the versions that can change its numbers (issue 25)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from peltbench.record import VERSIONED, versions

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        assert version, f"constraints.txt: {line!r} is not NAME==VERSION"
        pins[name.lower().replace("_", "-")] = Version(version)
    return pins


def test_constraints_pin_every_requirement_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements += [Requirement(r) for r in extra if not r.startswith("peltbench[")]
    pins = _pins()
    for req in requirements:
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt: {name}=={pins[name]} is outside {req}"
    for name in VERSIONED:
        assert name in pins, f"constraints.txt does not pin {name}, which a record names"


def test_transformers_stays_below_the_release_that_breaks_peft_prefix_tuning():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [req] = [Requirement(r) for r in project["dependencies"] if r.startswith("transformers")]
    assert not req.specifier.contains("5.24.0") and req.specifier.contains(str(_pins()["transformers"]))


def test_a_record_names_every_package_that_can_change_its_numbers():
    found = versions()
    for name in ("python", "torch", "transformers", "peltbench", "git_commit", *VERSIONED):
        assert name in found
    for name in ("peft", "numpy", "scipy", "scikit-learn", "datasets", "tokenizers", "hydra-core"):
        assert found[name], f"{name} is installed here: its version belongs in the record"
