"""Imports flow one way: the Hydra plugins in hydra_plugins/ depend on peltbench, never the reverse; peltbench finds
its launchers through the `peltbench.launchers` entry points (peltbench/launchers.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> list[str]:
    """Every module an `import` statement of the file names, lazy imports inside functions included, and every
    string given to importlib.import_module or __import__."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            names += [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return names


def test_no_peltbench_module_imports_a_hydra_plugin():
    files = sorted((ROOT / "peltbench").rglob("*.py"))
    assert len(files) > 20
    offenders = [f"{path.relative_to(ROOT)} imports {name}" for path in files for name in imported_modules(path)
                 if name == "hydra_plugins" or name.startswith("hydra_plugins.")]
    assert offenders == []


def test_the_plugins_import_peltbench():  # the direction that is allowed, so the scan above sees imports at all
    plugin = ROOT / "hydra_plugins" / "peltbench_local" / "_launcher.py"
    assert "peltbench.missing" in imported_modules(plugin)


def test_peltbench_registers_its_launchers_without_importing_them_itself():
    code = ("import sys\n"
            "import peltbench.cli, peltbench.missing, peltbench.runner\n"
            "assert not [m for m in sys.modules if m.startswith('hydra_plugins.peltbench')], 'imported before registering'\n"
            "from peltbench.launchers import register_launchers\n"
            "register_launchers()\n"
            "from hydra.core.plugins import Plugins\n"
            "from hydra.plugins.launcher import Launcher\n"
            "print(sorted(c.__name__ for c in Plugins.instance().discover(Launcher) if c.__name__.startswith('Peltbench')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['PeltbenchLocalLauncher', 'PeltbenchSlurmLauncher']"
