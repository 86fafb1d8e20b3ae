"""A researcher's own component, outside peltbench (issue 45): named by its import path in a method file of their own
config folder, checked before torch from its declaration, trained alone and fused with the built-ins, saved, counted
and tabled, with the identity of its code in its records (docs/components.md)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, compose_config, tiny_run_overrides
from peltbench import UserError
from peltbench.component import ComponentError, declaration, install_order, read_declaration

PELTBENCH = str(Path(sys.executable).with_name("peltbench"))


def write_package(root: Path, files: dict[str, str]) -> None:
    """A user's code: each file of `files` (its path under `root`: its text), its folders made."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def write_lora_copy(root: Path, package: str = "mylab", module: str = "lora_copy") -> Path:
    """peltbench/methods/lora.py copied into a user's package with only its relative imports made absolute."""
    folder = root / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text("")
    source = (REPO / "peltbench" / "methods" / "lora.py").read_text()
    source = source.replace("from ..", "from peltbench.").replace("from .base ", "from peltbench.methods.base ")
    assert "from ." not in source
    (folder / f"{module}.py").write_text(source)
    return folder / f"{module}.py"


def write_method(conf: Path, name: str, component: str, base: str = "lora") -> Path:
    """conf/method/<base>.yaml with `name: <name>` and `components: [<component>]`, in a user's config folder."""
    (conf / "method").mkdir(parents=True, exist_ok=True)
    text = (REPO / "conf" / "method" / f"{base}.yaml").read_text()
    text = re.sub(r"^name: \w+", f"name: {name}", text, flags=re.M)
    text = re.sub(r"^components: \[\w+\]", f"components: [{component}]", text, flags=re.M)
    path = conf / "method" / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def user_path(monkeypatch):
    """`user_path(folder)` puts a user's code folder on this process's path; its modules (and what peltbench read of
    them) are forgotten after the test, so the next test's package of the same name is its own."""
    from peltbench import component, packaged

    before = set(sys.modules)

    def add(folder: Path) -> None:
        monkeypatch.syspath_prepend(str(folder))
        forget()

    def forget() -> None:
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("mylab", "broken", "lokr_example"):
                del sys.modules[name]
        component.declaration.cache_clear()
        component.code_identity.cache_clear()
        component.source_identity.cache_clear()
        component._distributions.cache_clear()
        packaged.use_searchpath(None)
        packaged._user_dirs = None  # as before any config was composed here

    yield add
    forget()


@pytest.fixture
def user(workdir):
    """A working folder with a tiny BERT, GLUE files, the user's package `mylab` (on PYTHONPATH) and config folder."""
    write_lora_copy(workdir / "code")
    write_method(workdir / "conf", "my_lora", "mylab.lora_copy")
    return workdir


def run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(cwd / "code"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path, **(env or {})}
    return subprocess.run([*args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def common(user: Path) -> list[str]:
    return ["task=rte", "model.name=tiny-bert", "data.dir=glue", "k=16", "dev_size=20", "train.epochs=3",
            f"hydra.searchpath=[file://{user / 'conf'}]"]


def test_a_copy_of_lora_fused_with_lora_trains_as_lora_and_is_saved_counted_and_tabled(user, user_path, capsys,
                                                                                      monkeypatch):
    """Acceptance: lora.py copied into mylab, named by my_lora.yaml (lora.yaml with its name and component changed),
    trains in one fused group with the built-in lora, dropout on, and each member's record is the built-in's."""
    result = run(PELTBENCH, "-m", "method=lora,my_lora", "fuse=true", "save.weights=true", "save.predictions=true",
                 *common(user), cwd=user)
    assert result.returncode == 0, result.stderr[-3000:]
    found = {json.loads(path.read_text())["method"]: path for path in (user / "results").rglob("result.json")}
    assert sorted(found) == ["lora", "my_lora"]
    lora, mine = (json.loads(found[name].read_text()) for name in ("lora", "my_lora"))
    assert lora["fused"]["size"] == mine["fused"]["size"] == 2 and lora["fused"]["group"] == mine["fused"]["group"]
    assert mine["config"]["method"]["components"] == ["mylab.lora_copy"]
    for key in ("test", "dev_best"):
        assert mine[key] == pytest.approx(lora[key], abs=1e-6), key
    assert len(mine["history"]) == len(lora["history"]) == 3
    for ours, theirs in zip(mine["history"], lora["history"]):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)
        assert ours["dev_main"] == pytest.approx(theirs["dev_main"], abs=1e-6)
    assert mine["trainable_params"] == lora["trainable_params"]
    # the code that made it is in its identity; a built-in's identity is as it always was
    assert re.fullmatch(r"code [0-9a-f]{16}", mine["identity"]["code"]["mylab.lora_copy"])
    assert "code" not in lora["identity"]
    # saved and reloaded in this process (the user's package on its path): the same predictions; its PEFT copy is
    # LoRA's (the copy declares peft=Peft("LORA"))
    folder = found["my_lora"].parent
    assert json.loads((folder / "peft" / "adapter_config.json").read_text())["peft_type"] == "LORA"
    user_path(user / "code")
    import peltbench

    _, predictions = peltbench.load_run(folder).predict()
    saved = [int(row["prediction"]) for row in csv.DictReader(open(folder / "predictions.csv"))]
    assert list(map(int, predictions)) == saved
    # done for peltbench-missing (its method file found through the same hydra.searchpath)
    from peltbench.missing import main as missing

    monkeypatch.chdir(user)
    assert missing(["-m", "method=lora,my_lora", "fuse=true", "save.weights=true", "save.predictions=true",
                    *common(user)]) == 0
    assert "2 runs: 2 done" in capsys.readouterr().out
    # counted beside peltbench's methods
    from peltbench.params import main as params

    params(["--config-dir", str(user / "conf"), "--csv"])
    rows = {line.split(",")[0]: line.split(",")[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["my_lora"] == rows["lora"]
    # tabled beside the built-ins, with the paired tests
    from peltbench.tables.command import main as tables

    assert tables(["--results-dir", str(user / "results" / "runs"), "--out", str(user / "tables"), "--seeds", "1",
                   "--ddof", "0", "--baseline", "lora", "--protocol", "train.epochs=3,dev_size=20,precision=fp32"]) == 0
    assert "| K = 16 | RTE    | my_lora  | LoRA" in (user / "tables" / "paired.md").read_text()
    assert "my_lora" in (user / "tables" / "table1.md").read_text()


def test_a_bad_setting_of_a_users_component_is_refused_before_torch(user):
    script = ("import sys; from peltbench.cli import main\n"
              "sys.argv = ['peltbench', *sys.argv[1:]]\n"
              "try:\n    main()\nexcept SystemExit as exit:\n"
              "    print(exit.code, sorted({'torch', 'transformers'} & set(sys.modules)))")
    result = run(sys.executable, "-c", script, "method=my_lora", "method.lora_rank=0", *common(user), cwd=user)
    assert result.stdout == "2 []\n", result.stdout + result.stderr
    assert result.stderr == "peltbench: error: method.lora_rank=0: must be a positive integer\n"
    result = run(sys.executable, "-c", script, "method=my_lora", *common(user), cwd=user,
                 env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert result.stdout == "2 []\n"
    assert result.stderr == ("peltbench: error: method.components=[mylab.lora_copy]: component mylab.lora_copy: its "
                             "module is not on this Python's path (pip install its package, or add the folder above "
                             "it to PYTHONPATH)\n")
    assert not (user / "results").exists()


def test_a_users_method_file_named_as_a_packaged_one_is_refused(user):
    write_method(user / "conf", "lora", "mylab.lora_copy")
    result = run(PELTBENCH, "method=lora", *common(user), "--cfg", "job", cwd=user)
    assert result.returncode == 2
    assert result.stderr.startswith(f"peltbench: error: {user / 'conf' / 'method' / 'lora.yaml'}: peltbench ships a "
                                    "method of that name")


def test_a_declaration_is_read_without_running_its_module_or_package(tmp_path, user_path):
    """The package's __init__ and the module itself would fail to import here: the declaration is still read."""
    write_package(tmp_path, {
        "broken/__init__.py": "raise RuntimeError('never run')\n",
        "broken/thing.py": "import torch_that_is_not_installed\n"
                           "from peltbench.component import Component, POSITIVE_INT, Setting\n"
                           "HELP = 'the width'\n"
                           "COMPONENT = Component(stage='module', settings={'width': Setting(POSITIVE_INT, HELP)}, "
                           "after=('adapter',))\n"})
    user_path(tmp_path)
    component = declaration("broken.thing")
    assert component.settings["width"].help == "the width" and component.stage == "module"
    assert "broken" not in sys.modules
    assert install_order(["prefix", "broken.thing", "lora", "adapter", "full"]) == \
        ["full", "adapter", "broken.thing", "prefix", "lora"]


@pytest.mark.parametrize("source,message", [
    ("X = 1\n", "declares no COMPONENT = Component(...)"),
    ("import os\nCOMPONENT = Component(stage=os.sep)\n", "its COMPONENT names os, which is neither"),
    ("COMPONENT = Component(stage='everywhere')\n", "stage='everywhere': must be one of backbone, affine, module"),
    ("COMPONENT = Setting(POSITIVE_INT, 'x')\n", "is a Setting, not a Component"),
    ("COMPONENT = Component(stage='module'\n", "line 1: its COMPONENT cannot be read"),
])
def test_a_declaration_that_cannot_be_read_is_one_line(source, message):
    with pytest.raises(ComponentError, match=re.escape(message)):
        read_declaration(source, "mylab/thing.py", "mylab.thing")


def test_two_components_may_share_a_setting_only_as_they_declare_it_alike(tmp_path, user_path):
    write_package(tmp_path, {"mylab/wide.py": "from peltbench.component import Component, POSITIVE_NUMBER, Setting\n"
                                              "COMPONENT = Component(stage='projection', settings={'lora_rank': "
                                              "Setting(POSITIVE_NUMBER, 'a width')})\n"})
    user_path(tmp_path)
    from peltbench.config import check_method

    method = compose_config("method=lora", "task=rte").method
    method.components = ["lora", "mylab.wide"]
    with pytest.raises(UserError, match=re.escape("method.components=[lora,mylab.wide]: lora and mylab.wide both read "
                                                  "method.lora_rank, declared differently")):
        check_method(method)
    method.components = ["lora", "peltbench.methods.dora"]
    with pytest.raises(UserError, match="peltbench.methods.dora is the built-in component dora: name it dora"):
        check_method(method)


def test_a_change_of_a_users_code_is_another_run_named_in_one_line(tmp_path, tiny_checkpoint, glue_dir, user_path):
    """Issue 45, item 3: a record stores which code made it (its package's version where there is one, a hash of its
    module's source and of the modules of its package it imports). Once that code changes, the old record is not done
    (the rerun, peltbench-missing), no table pools it, load_run refuses it: one line naming what changed, the rule
    of a changed meaning (record.changed_meaning). A built-in adds nothing to an identity."""
    from peltbench.missing import _check_run
    from peltbench.record import changed_meaning, check_existing, config_hash, record_path, semantic_config
    from peltbench.runner import load_run, run_group
    from peltbench.tables.records import read_records

    module = write_lora_copy(tmp_path / "code")
    (module.parent / "common.py").write_text("SCALE = 1.0\n")
    module.write_text(module.read_text() + "\nfrom .common import SCALE  # noqa: E402, F401\n")
    dist = tmp_path / "code" / "mylab_tools-0.3.dist-info"  # as `pip install` leaves it
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab-tools\nVersion: 0.3\n")
    (dist / "top_level.txt").write_text("mylab\n")
    user_path(tmp_path / "code")
    from peltbench import component

    component._distributions.cache_clear()
    cfg = compose_config("method=lora", "task=rte", "save.weights=true",
                         *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path / "results"))
    cfg.method.name, cfg.method.components = "my_lora", ["mylab.lora_copy"]
    first = semantic_config(cfg)["code"]["mylab.lora_copy"]
    assert re.fullmatch(r"version 0\.3, code [0-9a-f]{16}", first)
    builtin = compose_config("method=lora", "task=rte")
    assert "code" not in semantic_config(builtin) and config_hash(builtin) == "3ac411bb92f60590"  # as before issue 45
    [outcome] = run_group([cfg])
    assert outcome.status == "ok"
    path = record_path(cfg, tmp_path / "results")
    record = json.loads(path.read_text())
    assert record["identity"]["code"] == {"mylab.lora_copy": first} and changed_meaning(record) == []

    (module.parent / "common.py").write_text("SCALE = 2.0\n")  # a module it imports changes: another run
    user_path(tmp_path / "code")
    now = component.code_identity("mylab.lora_copy")
    assert now != first and now.startswith("version 0.3, code ")
    changed = f"the code of mylab.lora_copy (record {first!r}, this run {now!r})"
    assert changed_meaning(record) == [changed]
    with pytest.raises(UserError, match=re.escape(f"holds a record of a different config ({changed}); move it away")):
        check_existing(path, cfg)
    run = _check_run(cfg, 0, {})
    assert (run.state, run.error) == ("foreign", changed)
    records, unreadable = read_records(tmp_path / "results")
    assert records.empty and [(str(s.path), s.kind, s.reason) for s in unreadable] == [
        (str(path), "changed", f"made when its config meant another run ({changed}): rerun it (move this record away "
                               "first)")]
    with pytest.raises(UserError, match=re.escape(f"made by other code than this Python's ({changed})")):
        load_run(path.parent)


# A user's package, and what peltbench 87d2410 (before the code's meaning was hashed) stored for its component
# mylab.sub.loha: its code_identity, the `source` rule (the bytes of the module and of the modules it imports).
PACKAGE = {
    "mylab/__init__.py": '"""My lab."""\nfrom .settings import SCALE  # every component scales by it\n',
    "mylab/settings.py": "SCALE = 1.0\n",
    "mylab/sub/__init__.py": "",
    "mylab/sub/loha.py": '"""LoHa, as PEFT."""\nfrom mylab.common import helper\n\n\ndef delta(x):\n    """The delta."""\n'
                         "    return helper(x)  # twice\n",
    "mylab/common.py": "def helper(x):\n    return 2 * x\n",
}
BY_SOURCE_RULE = "source 1bf056dd660ad033"


def test_a_users_code_is_every_module_importing_it_runs_read_for_what_it_computes(tmp_path, user_path):
    """Issue 58, item 3: importing mylab.sub.loha runs mylab/__init__.py and mylab/sub/__init__.py first, and what they
    import: a change there is another code. A comment, a docstring or a change of layout alone is the same code."""
    from peltbench import component

    write_package(tmp_path, PACKAGE)

    def code_with(name: str, text: str) -> str:
        (tmp_path / name).write_text(text)
        user_path(tmp_path)
        try:
            return component.code_identity("mylab.sub.loha")
        finally:
            write_package(tmp_path, PACKAGE)

    user_path(tmp_path)
    first = component.code_identity("mylab.sub.loha")
    assert re.fullmatch(r"code [0-9a-f]{16}", first)
    # what importing it runs: the packages above it, and what they import
    assert code_with("mylab/settings.py", "SCALE = 2.0\n") != first
    assert code_with("mylab/__init__.py", "from .settings import SCALE\nSCALE = 2 * SCALE\n") != first
    assert code_with("mylab/sub/__init__.py", "import mylab.common\nmylab.common.helper = abs\n") != first
    assert code_with("mylab/common.py", "def helper(x):\n    return 3 * x\n") != first
    # what it does not run: another module of its package
    assert code_with("mylab/other.py", "SCALE = 3.0\n") == first
    # what computes nothing: comments, docstrings, layout (line breaks, parentheses, quotes, trailing commas)
    assert code_with("mylab/sub/loha.py", "'''LoHa.'''\n# PEFT's\nfrom mylab.common import (\n    helper,\n)\n"
                                          "def delta(x):\n    '''Its delta.'''\n    return (helper(x))\n") == first
    assert code_with("mylab/__init__.py", "from .settings import (SCALE)\n") == first
    assert code_with("mylab/common.py", 'def helper(x):\n    "Twice x."\n    return 2*x  # twice\n') == first
    # the rule before: the module's and its imports' bytes, the packages above it left out
    assert component.source_identity("mylab.sub.loha") == BY_SOURCE_RULE
    assert code_with("mylab/__init__.py", "SCALE = 2.0\n") != first
    # importing a module of another subpackage runs that subpackage's __init__ first
    write_package(tmp_path, {"mylab/sub/loha.py": "from mylab.util.tools import helper\n", "mylab/util/__init__.py": "",
                             "mylab/util/tools.py": "def helper(x):\n    return x\n"})
    user_path(tmp_path)
    plain = component.code_identity("mylab.sub.loha")
    assert code_with("mylab/util/__init__.py", "SCALE = 2.0\n") != plain


def test_a_record_made_by_the_rule_before_is_done_while_that_rule_gives_todays_code_its_hash(tmp_path, user_path):
    """Issue 58, item 3: records made since the code identity was introduced stored `source <hash>` (the files'
    bytes). Such a record is the run of today's code where that rule's hash of today's code is the one it stored: done
    for a rerun, peltbench-missing and the tables, never rerun nor left out for the rule's change alone. Once those
    files change, it is another code's record, named by that rule on both sides; a record of today's rule is not
    touched by a comment."""
    from peltbench import component
    from peltbench.missing import _check_run
    from peltbench.record import (changed_meaning, check_existing, config_hash, identity_hash, record_path,
                                  semantic_config)
    from peltbench.runner import _identity
    from peltbench.tables.records import read_records

    write_package(tmp_path / "code", PACKAGE)
    user_path(tmp_path / "code")
    cfg = compose_config("method=lora", "task=rte", f"results_dir={tmp_path / 'results'}")
    cfg.method.name, cfg.method.components = "my_loha", ["mylab.sub.loha"]
    today = semantic_config(cfg)
    assert today["code"] == {"mylab.sub.loha": component.code_identity("mylab.sub.loha")}
    before = {**today, "code": {"mylab.sub.loha": BY_SOURCE_RULE}}  # as 87d2410 wrote it
    record = {**_identity(cfg, config_hash(cfg)), "identity": before, "config_hash": identity_hash(before),
              "status": "ok", "test": {"accuracy": 61.0, "main": 61.0}, "dev_best": {"accuracy": 60.0, "main": 60.0},
              "best_epoch": 3, "epochs_run": 13}
    path = record_path(cfg, tmp_path / "results")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    assert record["config_hash"] != config_hash(cfg)
    assert check_existing(path, cfg) == record and changed_meaning(record) == []
    assert _check_run(cfg, 0, {}).state == "done"
    records, skipped = read_records(tmp_path / "results")
    assert list(records["method"]) == ["my_loha"] and skipped == []

    (tmp_path / "code" / "mylab" / "common.py").write_text("def helper(x):\n    return 2 * x  # twice\n")
    user_path(tmp_path / "code")  # a comment in a file the rule before hashed: another code by that rule
    assert semantic_config(cfg) == today
    changed = (f"the code of mylab.sub.loha (record {BY_SOURCE_RULE!r}, "
               f"this run {component.source_identity('mylab.sub.loha')!r})")
    assert changed_meaning(record) == [changed]
    with pytest.raises(UserError, match=re.escape(f"holds a record of a different config ({changed}); move it away")):
        check_existing(path, cfg)
    assert (_check_run(cfg, 0, {}).state, _check_run(cfg, 0, {}).error) == ("foreign", changed)

    now = {**record, "identity": today, "config_hash": identity_hash(today)}  # a record of today's rule
    path.write_text(json.dumps(now))
    assert check_existing(path, cfg) == now and changed_meaning(now) == []


def test_the_tables_name_a_users_method_as_its_component_declares_it(tmp_path, user_path):
    """Issue 58, item 4: a method of the user's named as its component (`loha`, of mylab.loha) is `LoHa` in the
    tables, placed among the later methods by its paper (arXiv 2108.06098: before DoRA's 2402.09353), as a built-in
    is named by its declaration; one named otherwise (`loha_big`) keeps its name, after them, and one whose label
    another method has (a copy of lora.py declares LoRA's) keeps its name, placed by its paper (LoRA's)."""
    from peltbench import packaged
    from peltbench.record import config_hash, record_path
    from peltbench.runner import _identity
    from peltbench.tables.command import main

    write_lora_copy(tmp_path / "code")
    (tmp_path / "code" / "mylab" / "loha.py").write_text(
        "from peltbench.component import POSITIVE_INT, Component, Setting\n\n"
        'COMPONENT = Component(stage="projection", settings={"loha_rank": Setting(POSITIVE_INT, "LoHa: the rank")},\n'
        '                      label="LoHa", arxiv="2108.06098")\n')
    user_path(tmp_path / "code")
    runs = tmp_path / "runs"
    methods = {"lora": "lora", "dora": "dora", "loha": "mylab.loha", "loha_big": "mylab.loha",
               "lora_copy": "mylab.lora_copy"}
    for method, component in methods.items():
        if method != component:
            write_method(tmp_path / "conf", method, component)
    packaged.use_searchpath([f"file://{tmp_path / 'conf'}"])  # as the sweep that wrote them had it
    for score, method in enumerate(methods, start=70):
        cfg = compose_config(f"method={method}", "task=rte", "seed=111", "model.name=bert-base-uncased",
                             f"hydra.searchpath=[file://{tmp_path / 'conf'}]")
        record = {**_identity(cfg, config_hash(cfg)), "status": "ok", "test": {"accuracy": score, "main": score},
                  "dev_best": {"accuracy": score, "main": score}, "best_epoch": 3, "epochs_run": 13}
        path = record_path(cfg, runs)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))
    out = tmp_path / "out"
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path / "none")]) == 0
    rows = [line.split("|")[1].strip() for line in (out / "table1.md").read_text().splitlines()
            if line.startswith("| ") and "(n=1)" in line]
    assert rows == ["LoRA", "lora_copy", "LoHa", "DoRA", "loha_big"]


# The reviewers' case (issue 58): a LoRA of the user's own that also trains each layer's base query weight, one tensor
# for every member (mark(..., stacked=False)). Fused, MemberAdamW would move it through member 0 only, and the fused
# records were plain LoRA's (test 50.92 fused against 58.83 alone, "6 done, 0 failed").
TRAINS_BASE = ("        mark(model, lora.coefficient.gate_parameters(), "
               "[m for m in on_target if on_target[m].get(\"gated\", False)])\n")
BASE_MARK = ("    for layer in model.layers:  # the base query weight trains too: one tensor for every member\n"
             "        mark(model, [frozen_projection(model, layer, \"query\").weight], users, stacked=False)\n")


def write_base_trainer(code: Path, alone: bool) -> None:
    """mylab.base_lora: lora.py, also training the base query weights with stacked=False; `alone`: declared so."""
    module = write_lora_copy(code, module="base_lora")
    source = module.read_text()
    assert source.count(TRAINS_BASE) == 1
    source = source.replace(TRAINS_BASE, TRAINS_BASE + BASE_MARK)
    if alone:
        source = source.replace('    label="LoRA",', '    alone="it trains the base query weights", label="LoRA",', 1)
        assert "alone=" in source
    module.write_text(source)


@pytest.mark.parametrize("alone", [False, True])
def test_a_component_that_trains_a_tensor_every_member_shares_never_fuses_silently(alone, user, user_path, in_process):
    """Undeclared, it is refused when its model is built, fused or alone (one line naming the component and the tensor,
    a failed record; the lora run planned beside it trains without it, as its run alone); declared `alone`, the plan
    keeps it out of every group and it trains alone, its base weights counted."""
    write_base_trainer(user / "code", alone)
    write_method(user / "conf", "my_base", "mylab.base_lora")
    user_path(user / "code")
    result = in_process("-m", "method=lora,my_base", "fuse=true", *common(user), cwd=user)
    records = {json.loads(path.read_text())["method"]: json.loads(path.read_text())
               for path in (user / "results").rglob("result.json")}
    lora, mine = records["lora"], records["my_base"]
    if not alone:
        assert result.returncode == 1, result.stderr[-3000:]
        assert mine["status"] == "failed" and mine["test"] is None
        assert mine["error"] == (
            "component mylab.base_lora trains bert.encoder.layer.0.attention.self.query.weight without a member "
            "dimension (mark(..., stacked=False)) but does not declare `alone`: the runs of a fused group would share "
            "that one tensor; declare alone=\"<why>\" in its COMPONENT (its runs then always train alone, as "
            "fine-tuning's), or give the tensor a member dimension (docs/components.md)")
        assert lora["status"] == "ok" and lora["fused"] is None  # the group went on without it: lora alone
        return
    assert result.returncode == 0, result.stderr[-3000:]
    assert mine["status"] == lora["status"] == "ok" and mine["fused"] is None
    assert mine["trainable_params"] == lora["trainable_params"] + 2 * 32 * 32  # two layers' 32 × 32 query weights


def test_a_tensor_marked_per_member_without_a_slot_per_member_is_refused_when_built(tmp_path, user_path):
    """A Parameter every member would share (no leading member dimension), marked with mark's default: refused when the
    model is built (peltbench-params builds it too, on the meta device), naming the component and the tensor."""
    from peltbench.component import ComponentError
    from peltbench.methods import build_pelt_model

    write_package(tmp_path, {
        "mylab/__init__.py": "",
        "mylab/shared.py": "import torch\nfrom torch import nn\nfrom peltbench.component import Component\n"
                           "from peltbench.methods.base import mark\n"
                           "COMPONENT = Component(stage='module')\n"
                           "def install(model, users):\n"
                           "    model.shared_scale = nn.Parameter(torch.zeros(4))  # one tensor for every member\n"
                           "    mark(model, [model.shared_scale], users)\n"
                           "def init_member(model, slot, method):\n    pass\n"})
    user_path(tmp_path)
    from conftest import tiny_backbone

    method = compose_config("method=lora", "task=rte").method
    method.components = ["mylab.shared"]
    with pytest.raises(ComponentError, match=re.escape(
            "component mylab.shared marks shared_scale (shape (4,)) as one slot per member (mark's default), but its "
            "first dimension is not the group's 3 members: give it a leading member dimension")):
        build_pelt_model(tiny_backbone(), [method] * 3, [1, 2, 3])
