"""Successive halving in fused grids (`halving=η`, issue 24 item 3): every rung decision recomputed from the records'
dev histories alone; survivors' records equal the same runs trained without halving; pruned runs are done for a
halving sweep, peltbench-missing and the tables, and trained fully with halving off; a sweep killed mid-rung and run
again reaches the same decisions and records."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import compose_config, save_tiny_encoder, write_glue
from peltbench import UserError
from peltbench.halving import bracket_id, candidate_score, decide, replay, rungs, seed_score

LRS = ("1e-4", "1e-2", "1e-1", "3e-1")
SEEDS = (111, 222)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT with O(1) weights (scores differ between learning rates) and small GLUE files."""
    root = tmp_path_factory.mktemp("halving")
    return save_tiny_encoder("bert", root / "ckpt", dropout=0.1), write_glue(root / "glue")


def grid(data, results, *extra: str, lrs=LRS, seeds=SEEDS, method="lora", halving="3"):
    checkpoint, glue = data
    return [compose_config(f"method={method}", f"method.lr={lr}", "task=rte", f"model.name={checkpoint}",
                           f"data.dir={glue}", f"results_dir={results}", "k=16", "dev_size=20", "train.batch_size=8",
                           "train.epochs=10", "train.patience=null", "logger=[]", "device=cpu", "fuse=true",
                           f"halving={halving}", f"seed={seed}", *extra)
            for lr in lrs for seed in seeds]


def records(results: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(Path(results).rglob("result.json"))]


def recompute(found: list[dict], eta: int, length: int) -> dict[int, set[str]]:
    """From the records alone: which candidates each rung prunes, by the rule of docs/protocol.md §11."""
    by_candidate: dict[str, list[dict]] = {}
    for record in found:
        by_candidate.setdefault(record["variant"], []).append(record)
    decisions = {}
    for rung in rungs(eta, length):
        def trains_on(record):
            if record["status"] == "pruned":
                return record["pruned"]["rung"] >= rung
            return record["status"] == "ok" and record["epochs_run"] > rung
        live = {name for name, runs in by_candidate.items() if any(trains_on(r) for r in runs)}
        if len(live) < 2:
            decisions[rung] = set()
            continue
        scores = {name: candidate_score([seed_score(r["history"], rung)
                                         for r in sorted(by_candidate[name], key=lambda r: r["seed"])])
                  for name in live}
        decisions[rung] = set(decide(scores, eta)[1])
    return decisions


def same_record(a: dict, b: dict, label: str) -> None:
    """Every field but timings, the run's config as given (halving, fuse) and when it ran (tests/test_randomness.py);
    scores to the record's rounding (4 decimals), as one side may be read back from its result.json."""
    assert a["status"] == b["status"] == "ok", label
    for key in ("train_loss", "dev_main"):
        assert [h[key] for h in a["history"]] == pytest.approx([h[key] for h in b["history"]], rel=1e-5, abs=1e-4), \
            f"{label}: {key}"
    for key in ("best_epoch", "epochs_run", "train_steps", "config_hash", "variant", "split"):
        assert a[key] == b[key], f"{label}: {key}"
    assert a["test"] == pytest.approx(b["test"], abs=1e-4), label
    assert a["dev_best"] == pytest.approx(b["dev_best"], abs=1e-4), label


# ---------------------------------------------------------------- the rule

def test_rungs_grow_by_eta_below_the_runs_length():
    assert rungs(3, 50) == [1, 3, 9, 27]
    assert rungs(3, 10) == [1, 3, 9]
    assert rungs(3, 9) == [1, 3]  # the last evaluation is no rung: every survivor ends there anyway
    assert rungs(2, 1) == []
    assert rungs(4, 10) == [1, 4]
    assert rungs(3, 50, first=3) == [3, 9, 27]  # halving_first=3: r0, r0η, r0η², ...
    assert rungs(3, 5, first=2) == [2]
    assert rungs(2, 3, first=3) == []


def test_the_top_ceil_n_over_eta_stay_nan_last_ties_by_name():
    assert decide({"a": 1.0, "b": 3.0, "c": 2.0, "d": 0.5}, 3) == (["b", "c"], ["a", "d"])   # ceil(4/3) = 2
    assert decide({"b": 1.0, "a": 1.0, "c": math.nan}, 2) == (["a", "b"], ["c"])           # tie: by name; NaN last
    assert decide({"a": math.nan, "b": math.nan}, 3) == (["a"], ["b"])                      # at least one stays
    assert decide({"x": 5.0}, 3) == (["x"], [])
    history = [{"dev_main": 50.0}, {"dev_main": 61.23456}, {"dev_main": None}, {"dev_main": 70.0}]
    assert seed_score(history, 3) == 61.2346  # the best so far, as the record rounds it
    assert math.isnan(seed_score([], 1)) and math.isnan(seed_score([{"dev_main": None}], 1))
    assert candidate_score([60.0, 70.0]) == 65.0 and math.isnan(candidate_score([60.0, math.nan]))


def test_halving_needs_fuse_and_a_valid_eta_and_is_no_part_of_a_runs_identity(tiny, tmp_path):
    from peltbench.config import check_config
    from peltbench.record import config_hash, record_path

    [cfg] = grid(tiny, tmp_path, lrs=("1e-3",), seeds=(111,))
    [plain] = grid(tiny, tmp_path, lrs=("1e-3",), seeds=(111,), halving="null")
    check_config(cfg)
    assert config_hash(cfg) == config_hash(plain)
    assert record_path(cfg, tmp_path) == record_path(plain, tmp_path)
    with pytest.raises(UserError, match=r"^halving=3: successive halving compares the runs of a fused group; add fuse=true$"):
        check_config(grid(tiny, tmp_path, "fuse=false", lrs=("1e-3",), seeds=(111,))[0])
    with pytest.raises(UserError, match=r"^halving=1: must be null \(off\) or an integer η of at least 2"):
        check_config(grid(tiny, tmp_path, lrs=("1e-3",), seeds=(111,), halving="1")[0])


def test_halving_first_sets_the_first_rung_is_checked_and_names_another_bracket(tiny, tmp_path):
    from peltbench.config import check_config
    from peltbench.record import config_hash

    one = lambda *extra, halving="3": grid(tiny, tmp_path, *extra, lrs=("1e-3",), seeds=(111,), halving=halving)[0]
    [default, first2] = one(), one("halving_first=2")
    check_config(first2)
    assert config_hash(first2) == config_hash(default)  # not part of a run's identity, as halving is not
    # r0 = 1 keeps the ledger name it had before halving_first existed; another r0 is another bracket (another ledger)
    assert bracket_id(default).startswith("rte-k16-lora-eta3-") and "first" not in bracket_id(default)
    assert bracket_id(first2).startswith("rte-k16-lora-eta3-first2-")
    assert bracket_id(first2).rsplit("-", 1)[1] != bracket_id(default).rsplit("-", 1)[1]
    for extra, halving, message in (
            (("halving_first=0",), "3", r"^halving_first=0: must be a positive integer"),
            (("halving_first=2",), "null", r"^halving_first=2: the first rung of successive halving; set halving=η too$"),
            (("halving_first=10",), "3", r"^halving=3 halving_first=10: a run of 10 dev evaluations has no rung before "
                                         r"its end \(halving would compare nothing\); lower halving_first or train longer$"),
            (("train.epochs=1",), "3", r"^halving=3 halving_first=1: a run of 1 dev evaluation has no rung before its end"),
            (("train.epochs=null", "train.max_steps=40", "train.eval_every=20", "halving_first=2"), "3",
             r"^halving=3 halving_first=2: a run of 2 dev evaluations has no rung")):
        with pytest.raises(UserError, match=message):
            check_config(one(*extra, halving=halving))


def test_the_plan_keeps_a_bracket_in_one_group_and_says_when_it_cannot(tiny, tmp_path, caplog):
    from peltbench.fusion import plan_groups

    cfgs = [*grid(tiny, tmp_path, seeds=(111, 222, 333)), *grid(tiny, tmp_path, method="adapter", seeds=(111, 222, 333))]
    assert [len(group) for group in plan_groups(cfgs)] == [12, 12]  # one group per method (without halving: 16 + 8)
    plain = [*grid(tiny, tmp_path, seeds=(111, 222, 333), halving="null"),
             *grid(tiny, tmp_path, method="adapter", seeds=(111, 222, 333), halving="null")]
    assert [len(group) for group in plan_groups(plain)] == [16, 8]
    interleaved = [cfgs[i] for i in range(0, 24, 3)] + [cfgs[i] for i in range(24) if i % 3]  # seeds far apart
    groups = plan_groups(interleaved)
    assert [len(group) for group in groups] == [12, 12]
    for group in groups:  # each candidate's seeds side by side
        names = [interleaved[i].method.lr for i in group]
        assert names == sorted(names, key=names.index) and len(set(names)) == 4
    small = grid(tiny, tmp_path, "fuse_members=5", seeds=(111, 222, 333))
    with caplog.at_level(logging.WARNING, logger="peltbench"):
        groups = plan_groups(small)
    assert [len(group) for group in groups] == [3, 3, 3, 3]  # never a candidate's seeds in two groups
    assert "its candidates are compared in 4 groups, each on its own" in caplog.text


# ---------------------------------------------------------------- a halving grid, trained

@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """The same grid (lora × 4 learning rates × 2 seeds, 10 epochs: rungs 1, 3, 9) with halving=3 and without."""
    from peltbench.runner import run_group

    root = tmp_path_factory.mktemp("trained")
    halved = run_group(grid(tiny, root / "halving"))
    full = run_group(grid(tiny, root / "full", halving="null"))
    return root, halved, full


def test_every_rung_decision_is_recomputed_from_the_records(trained):
    root, halved, _ = trained
    found = records(root / "halving")
    assert len(found) == 8 and {r["status"] for r in found} == {"ok", "pruned"}
    assert [o.status for o in halved].count("pruned") == 6  # rung 1: 2 of 4 candidates stay; rung 3: 1 of 2
    recomputed = recompute(found, 3, 10)
    recorded = {rung: {r["variant"] for r in found if r["status"] == "pruned" and r["pruned"]["rung"] == rung}
                for rung in rungs(3, 10)}
    assert recomputed == recorded and len(recorded[1]) == 2 and len(recorded[3]) == 1 and not recorded[9]
    [ledger] = (root / "halving" / ".halving").glob("*.json")
    ledger = json.loads(ledger.read_text())
    assert sorted(ledger["rungs"]) == ["1", "3"] and ledger["eta"] == 3 and ledger["rungs_planned"] == [1, 3, 9]
    for rung, [comparison] in ledger["rungs"].items():
        assert set(comparison["pruned"]) == recorded[int(rung)]
    for record in found:
        if record["status"] != "pruned":
            continue
        pruned = record["pruned"]
        assert record["test"] is None and record["error"] is None
        assert record["epochs_run"] == len(record["history"]) == pruned["rung"]
        assert pruned["eta"] == 3 and pruned["rank"] > pruned["kept"] and pruned["ledger"].startswith(".halving/")
        assert record["dev_best"]["main"] == max(h["dev_main"] for h in record["history"])


def histories(found: list[dict]) -> dict[str, list[list[dict]]]:
    """Per candidate, its seeds' dev histories (in the order of their data seeds)."""
    out: dict[str, list[list[dict]]] = {}
    for record in sorted(found, key=lambda r: (r["variant"], r["seed"])):
        out.setdefault(record["variant"], []).append(record["history"])
    return out


def test_a_replay_of_the_full_grids_records_makes_the_halving_grids_decisions(trained, tiny):
    """halving.replay from the grid trained without halving: the rungs the halving grid pruned at, exactly (r0 = 1);
    with halving_first=2 (rungs 2, 6) a grid trained so prunes where the replay says, and its survivors are the full
    grid's runs (scripts/compare_halving.py --first replays other r0 from a full grid so)."""
    from peltbench.runner import run_group

    root, halved, full = trained
    pruned_at = lambda found: {r["variant"]: r["pruned"]["rung"] for r in found if r["status"] == "pruned"}
    assert replay(histories(records(root / "full")), 3, 10) == pruned_at(records(root / "halving"))
    second = run_group(grid(tiny, root / "first2", "halving_first=2"))
    found = records(root / "first2")
    expected = replay(histories(records(root / "full")), 3, 10, first=2)
    assert sorted(expected.values()) == [2, 2, 6] and pruned_at(found) == expected
    [ledger] = (root / "first2" / ".halving").glob("*.json")
    ledger = json.loads(ledger.read_text())
    assert ledger["first"] == 2 and ledger["rungs_planned"] == [2, 6] and sorted(ledger["rungs"]) == ["2", "6"]
    for a, b in zip(second, full):
        if a.status == "ok":
            same_record(a.record, b.record, a.record["variant"])
        else:
            assert a.record["epochs_run"] == a.record["pruned"]["rung"] == expected[a.record["variant"]]


def test_survivors_records_equal_the_same_runs_without_halving(trained):
    root, halved, full = trained
    survivors = [(a, b) for a, b in zip(halved, full) if a.status == "ok"]
    assert len(survivors) == 2
    for a, b in survivors:
        assert a.record["epochs_run"] == 10
        same_record(a.record, b.record, a.record["variant"])
    for a, b in zip(halved, full):  # a pruned run's history so far is the full run's first epochs
        if a.status == "pruned":
            rung = a.record["pruned"]["rung"]
            assert [h["dev_main"] for h in a.record["history"]] == \
                pytest.approx([h["dev_main"] for h in b.record["history"][:rung]], abs=1e-6)


def test_pruned_runs_are_done_for_missing_and_the_tables_and_never_in_a_table(trained, tiny):
    from omegaconf import open_dict

    from peltbench.missing import _check_run
    from peltbench.tables.records import read_records
    from peltbench.tables.scores import problem_runs
    from peltbench.tables.selection import select_settings

    root, halved, _ = trained
    def states(cfgs):  # peltbench-missing's view of each run (missing._check_run, with a sweep's log folder)
        for cfg in cfgs:
            with open_dict(cfg):
                cfg.hydra = {"sweep": {"dir": "sweep", "subdir": "0"}}
        return [_check_run(cfg, num, {}) for num, cfg in enumerate(cfgs)]

    assert [run.state for run in states(grid(tiny, root / "halving"))] == ["done"] * 8
    off = states(grid(tiny, root / "halving", halving="null"))  # halving off: the pruned runs are to train
    assert [run.state for run in off].count("done") == 2
    assert {run.error for run in off if run.state != "done"} == {
        f"pruned at rung {rung} by successive halving: without halving it trains fully" for rung in (1, 3)}
    runs, unreadable = read_records(root / "halving")
    assert not unreadable and sorted(runs["status"]) == ["ok"] * 2 + ["pruned"] * 6
    assert problem_runs(runs).empty  # not a failure, never averaged in
    chosen = select_settings(runs, ("lr",))
    rows = chosen.rows.set_index("value")
    survivor = next(o.record for o in halved if o.status == "ok")
    assert rows["chosen"].sum() == 1 and rows.loc[rows["chosen"], "pruned_at"].isna().all()
    assert float(rows.index[rows["chosen"]][0]) == survivor["config"]["method"]["lr"]
    pruned_at = {float(value): rung for value, rung in rows["pruned_at"].dropna().items()}
    assert pruned_at == {r["config"]["method"]["lr"]: r["pruned"]["rung"] for r in records(root / "halving")
                         if r["status"] == "pruned"}
    assert rows.loc[rows["pruned_at"].notna(), "test_mean"].isna().all()


def test_a_rerun_skips_pruned_runs_with_halving_and_trains_them_fully_without(trained, tiny, tmp_path):
    import shutil

    from peltbench.runner import run_group

    root, halved, full = trained
    again = run_group(grid(tiny, root / "halving"))
    assert all(o.skipped for o in again) and [o.status for o in again] == [o.status for o in halved]
    copy = tmp_path / "copy"
    shutil.copytree(root / "halving", copy)
    # a pruned record lost (killed between the ledger and the records): the rerun replays the recorded rung
    lost = next(o for o in halved if o.status == "pruned" and o.record["pruned"]["rung"] == 1)
    (copy / lost.record["variant"] / "rte" / "k16" / f"seed{lost.record['seed']}" / "result.json").unlink()
    replayed = run_group(grid(tiny, copy))
    [redone] = [o for o in replayed if not o.skipped]
    assert redone.status == "pruned" and redone.record["pruned"] == lost.record["pruned"]
    assert len(redone.record["history"]) == len(lost.record["history"])
    for a, b in zip(redone.record["history"], lost.record["history"]):  # alone now, in a group of 8 before: rounding
        assert a == pytest.approx(b, rel=1e-5)
    fully = run_group(grid(tiny, copy, halving="null"))
    assert [o.skipped for o in fully] == [o.status == "ok" for o in halved]
    for a, b in zip(fully, full):  # the survivors as before, the pruned runs now trained fully
        same_record(a.record, b.record, b.record["variant"])


PELTBENCH = str(Path(sys.executable).with_name("peltbench"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}


def test_a_halving_sweep_killed_mid_rung_and_rerun_reaches_the_same_decisions_and_records(trained, tiny, tmp_path,
                                                                                           in_process):
    """kill -9 right after the first rung's pruned records (the others train on toward rung 3): the rerun (in this
    process) re-forms the group from the survivors, replays rung 1 from the ledger, decides rung 3 as the
    uninterrupted sweep did (the `trained` fixture's halving grid: this sweep's runs, in one group without a kill)."""
    checkpoint, glue = tiny
    sweep_args = ["-m", "method=lora", f"method.lr={','.join(LRS)}", "seed=111,222", "task=rte", "k=16", "dev_size=20",
                  "train.batch_size=8", "train.epochs=10", "train.patience=null", "fuse=true", "halving=3",
                  f"model.name={checkpoint}", f"data.dir={glue}", "logger=[]", "device=cpu"]

    def sweep(results: str, name: str) -> subprocess.Popen:
        return subprocess.Popen([PELTBENCH, *sweep_args, f"results_dir={results}", f"hydra.sweep.dir={name}"],
                                cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    killed = sweep("resumed", "sweeps/killed")
    deadline = time.monotonic() + 240
    while not records(tmp_path / "resumed") and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    before = records(tmp_path / "resumed")
    assert before and {r["status"] for r in before} == {"pruned"} and {r["pruned"]["rung"] for r in before} == {1}
    rerun = in_process(*sweep_args, "results_dir=resumed", "hydra.sweep.dir=sweeps/rerun", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    uninterrupted = trained[0] / "halving"
    resumed, whole = records(tmp_path / "resumed"), records(uninterrupted)
    assert len(resumed) == len(whole) == 8
    assert [r["variant"] for r in resumed] == [r["variant"] for r in whole]
    assert [r["status"] for r in resumed] == [r["status"] for r in whole]
    assert recompute(resumed, 3, 10) == recompute(whole, 3, 10)
    for a, b in zip(resumed, whole):
        if a["status"] == "pruned":
            assert a["pruned"]["rung"] == b["pruned"]["rung"] and a["pruned"]["dev"] == b["pruned"]["dev"]
            assert [h["dev_main"] for h in a["history"]] == pytest.approx([h["dev_main"] for h in b["history"]], abs=1e-6)
        else:
            for key in ("train_loss", "dev_main"):
                assert [h[key] for h in a["history"]] == pytest.approx([h[key] for h in b["history"]], rel=1e-5, abs=1e-6)
            assert a["test"] == pytest.approx(b["test"], abs=1e-6) and a["best_epoch"] == b["best_epoch"]
    [ledger_a] = (tmp_path / "resumed" / ".halving").glob("*.json")
    [ledger_b] = (uninterrupted / ".halving").glob("*.json")
    decisions = lambda path: {rung: [(c["kept"], c["pruned"]) for c in cs]
                              for rung, cs in json.loads(path.read_text())["rungs"].items()}
    assert decisions(ledger_a) == decisions(ledger_b)


# The methods since 2024 under successive halving: a row per method or setting (its settings on the tiny model; a
# learning-rate grid whose candidates part by the first rung; whether the tiny model has O(1) weights; the statuses the
# halving grid must end with, where they are fixed). Adding a method adds a row.
HALVING_ROWS = {
    "fourierft": ("fourierft", ("1e-3", "5e-2", "3e-1"), ("method.fourierft_n_frequency=100",
                                                          "method.fourierft_scaling=20.0"), False, ["ok", "pruned", "pruned"]),
    "c3a": ("c3a", ("1e-3", "1e-1", "1"), ("method.c3a_block_size=8",), False, ["ok", "pruned", "pruned"]),
    "road": ("road", ("1e-4", "3e-2", "3e-1"), (), True, None),
    "delora": ("delora", ("1e-4", "1e-2", "1e-1"), (), True, None),
    "lora-pissa": ("lora", ("1e-5", "1e-3", "1e-1"), ("method.lora_init=pissa",), True, None),
    "dora-pissa": ("dora", ("1e-5", "1e-3", "1e-1"), ("method.lora_init=pissa",), True, None),
}


# make test runs FourierFT's row (its statuses fixed); the other rows are make test-slow's (2-5 s each): halving itself
# is the grids' above, and each method fused with members that leave is tests/test_checkpoint.py's and
# tests/test_randomness.py's
@pytest.mark.parametrize("row", [row if row == "fourierft" else pytest.param(row, marks=pytest.mark.slow)
                                 for row in sorted(HALVING_ROWS)])
def test_successive_halving_of_each_new_methods_grid_keeps_the_full_grids_records(tmp_path, row):
    """A learning-rate grid under halving=2 (dropout on): some candidates are pruned, the survivors' records are those
    of the same runs without halving, and a pruned run's history is the full run's first epochs."""
    from conftest import O1_INIT, save_tiny_encoder, write_glue
    from peltbench.runner import run_group

    method, lrs, extra, o1, statuses = HALVING_ROWS[row]
    init = {"initializer_range": O1_INIT} if o1 else {}
    tiny = save_tiny_encoder("bert", tmp_path / "ckpt", dropout=0.1, **init), write_glue(tmp_path / "glue")
    halved = run_group(grid(tiny, tmp_path / "halving", *extra, lrs=lrs, seeds=(111,), method=method, halving="2"))
    full = run_group(grid(tiny, tmp_path / "full", *extra, lrs=lrs, seeds=(111,), method=method, halving="null"))
    if statuses is not None:
        assert sorted(o.status for o in halved) == statuses
    assert "pruned" in {o.status for o in halved} and "ok" in {o.status for o in halved}
    assert [o.status for o in full] == ["ok"] * len(lrs)
    for a, b in zip(halved, full):
        if a.status == "ok":
            same_record(a.record, b.record, a.record["variant"])
        else:
            rung = a.record["pruned"]["rung"]
            assert [h["dev_main"] for h in a.record["history"]] == \
                pytest.approx([h["dev_main"] for h in b.record["history"][:rung]], abs=1e-6)
