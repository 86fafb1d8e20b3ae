"""Each run's randomness is its own (issue 14): with dropout ON, a run gives the same record alone, in any fused group,
in a group re-formed after a kill and resume, trained in parts, or beside a run that diverges.

Tolerance for whole runs: losses, dev curves and scores to 1e-6 (relative 1e-5): the only difference allowed is the
float rounding of batched matmuls over more or fewer rows (on this CPU they come out equal).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import compose_config, save_tiny_encoder, tiny_method_overrides, write_glue
from peltbench.methods.randomness import COUNTERS, key_table, keep_mask, mix, row_salts
from peltbench.packaged import options

FROZEN = sorted(m for m in options("method") if m not in ("ft", "prompt"))  # prompt runs fuse by prompt length


def shaped(keys: torch.Tensor, dims: int) -> torch.Tensor:
    """One key per row, shaped to broadcast over `dims` trailing dimensions (as Members.dropout_keys gives them)."""
    return keys.view(-1, *[1] * dims)


# ---------------------------------------------------------------- the masks themselves

def test_the_hash_is_a_bijection_and_the_same_in_numpy_and_torch():
    values = np.random.default_rng(0).integers(0, 2**32, 200_000, dtype=np.uint64)
    hashed = mix(values)
    assert len(np.unique(hashed)) == len(np.unique(values))  # a bijection: no two inputs share an output
    assert hashed.max() < 2**32
    assert (mix(torch.from_numpy(values.astype(np.int64))).numpy() == hashed.astype(np.int64)).all()


def test_masks_keep_one_minus_p_and_are_independent_across_rows_sites_steps_and_seeds():
    """Keep rate 0.9 at p = 0.1; the masks of two rows, two sites, two steps, two runs are uncorrelated."""
    counters = COUNTERS.hidden(64, 384, torch.device("cpu"))  # 24,576 elements per row

    def masks(seed=42, data_seed=111, step=0, site=0, examples=(0, 1)):
        keys = torch.from_numpy(key_table(row_salts(seed, data_seed, step, list(examples)), site + 1)[site])
        return keep_mask(counters, shaped(keys, 2), 0.1).float()

    base = masks()
    assert abs(base.mean().item() - 0.9) < 0.005
    others = [masks()[1], masks(site=3)[0], masks(step=1)[0], masks(seed=43)[0], masks(data_seed=222)[0],
              masks(examples=(5, 1))[0]]
    for other in others:
        correlation = np.corrcoef(base[0].flatten().numpy(), other.flatten().numpy())[0, 1]
        assert abs(correlation) < 0.03
    assert torch.equal(masks()[0], base[0])  # and a function of its inputs only
    # Over many keys, one mask's correlations with the others spread as independent masks' do (std 1/√n).
    many = keep_mask(counters[:16], shaped(torch.from_numpy(key_table(row_salts(7, 8, 9, np.arange(1000)), 1)[0]), 2), 0.1)
    flat = many.flatten(1).float().numpy()
    correlations = np.array([np.corrcoef(flat[0], other)[0, 1] for other in flat[1:]])
    assert abs(correlations.std() * np.sqrt(flat.shape[1]) - 1) < 0.15 and abs(correlations.mean()) < 0.003


def test_a_rows_mask_does_not_depend_on_padding():
    """Counters number positions and features, so a batch padded further gives the real positions the same masks."""
    keys = torch.from_numpy(key_table(row_salts(42, 111, 3, [7, 9]), 5)[4])
    short = keep_mask(COUNTERS.hidden(20, 32, torch.device("cpu")), shaped(keys, 2), 0.1)
    long = keep_mask(COUNTERS.hidden(300, 32, torch.device("cpu")), shaped(keys, 2), 0.1)  # grows the cached table
    assert torch.equal(short, long[:, :20])
    attention = keep_mask(COUNTERS.attention(2, 20, 30, torch.device("cpu")), shaped(keys, 3), 0.1)
    wide = keep_mask(COUNTERS.attention(2, 25, 35, torch.device("cpu")), shaped(keys, 3), 0.1)
    assert torch.equal(attention, wide[:, :, :20, :30])


# ---------------------------------------------------------------- whole runs

@pytest.fixture(scope="module")
def dropout_on(tmp_path_factory):
    """A tiny BERT with dropout 0.1 everywhere (hidden, attention, head) and small GLUE files."""
    root = tmp_path_factory.mktemp("dropout_on")
    return save_tiny_encoder("bert", root / "ckpt", dropout=0.1), write_glue(root / "glue")


def runs(data, results, methods, *extra: str, fuse: bool = True):
    checkpoint, glue = data
    return [compose_config(f"method={name}", *tiny_method_overrides(name), "task=rte", f"model.name={checkpoint}",
                           f"data.dir={glue}", f"results_dir={results}", "k=16", "dev_size=20", "train.batch_size=8",
                           "train.epochs=2", "train.patience=2", "logger=[]", "device=cpu", f"fuse={str(fuse).lower()}",
                           *extra)
            for name in methods]


def same_record(a: dict, b: dict, label: str) -> None:
    """Field by field: everything but timings, the fused group and when it ran."""
    assert a["status"] == b["status"] == "ok", label
    for key in ("train_loss", "dev_main"):
        assert [h[key] for h in a["history"]] == pytest.approx([h[key] for h in b["history"]], rel=1e-5, abs=1e-6), \
            f"{label}: {key}"
    for key in ("best_epoch", "epochs_run", "train_steps", "trainable_params", "optimizer_params", "config_hash",
                "split"):
        assert a[key] == b[key], f"{label}: {key}"
    assert a["test"] == pytest.approx(b["test"], abs=1e-6), label
    assert a["dev_best"] == pytest.approx(b["dev_best"], abs=1e-6), label
    assert (a["gates"] is None) == (b["gates"] is None), label
    for submodule, values in (a["gates"] or {}).items():
        assert values == pytest.approx(b["gates"][submodule], abs=1e-6), f"{label}: gates {submodule}"


def test_every_method_alone_and_in_two_groupings_gives_one_record(dropout_on, tmp_path):
    """Dropout on: every frozen-backbone method alone, in a group of 4 and in a group of all the others (other runs,
    other seeds beside it) writes the same record. Fine-tuning trains alone and draws its masks the same way; prompt
    tuning fuses only with runs of its prompt length (test_prompt_runs_alone_and_fused_give_one_record)."""
    from peltbench.runner import run_group

    everything = run_group(runs(dropout_on, tmp_path / "all", FROZEN))
    few = ["unipelt_apl", "bitfit", "prefix_l50", "ln"]
    four = run_group([*runs(dropout_on, tmp_path / "four", few[:2]),
                      *runs(dropout_on, tmp_path / "four", few[2:], "seed=222"),
                      *runs(dropout_on, tmp_path / "four", ["unipelt_apl"], "seed=222")][:4])
    assert {o.record["fused"]["size"] for o in everything} == {len(FROZEN)}
    assert {o.record["fused"]["size"] for o in four} == {4}
    for name, together in zip(FROZEN, everything):
        [alone] = run_group(runs(dropout_on, tmp_path / "alone", [name], fuse=False))
        assert alone.record["fused"] is None
        same_record(alone.record, together.record, f"{name} alone vs among all")
    for name, outcome in zip(few[:2], four[:2]):
        same_record(outcome.record, everything[FROZEN.index(name)].record, f"{name} among 4 vs among all")


def test_prompt_runs_alone_and_fused_give_one_record(dropout_on, tmp_path):
    """Dropout on, prompts P = 20 in front of every row (masks keyed by the longer positions): a prompt run alone, and
    beside another prompt run of its length (other seed, other init), writes the same record."""
    from peltbench.runner import run_group

    together = run_group([*runs(dropout_on, tmp_path / "fused", ["prompt"]),
                          *runs(dropout_on, tmp_path / "fused", ["prompt"], "seed=222", "method.prompt_init=random")])
    assert {o.record["fused"]["size"] for o in together} == {2}
    for outcome, extra in zip(together, ([], ["seed=222", "method.prompt_init=random"])):
        [alone] = run_group(runs(dropout_on, tmp_path / "alone", ["prompt"], *extra, fuse=False))
        same_record(alone.record, outcome.record, f"prompt {extra} alone vs fused")


def test_a_group_trained_in_parts_or_beside_a_diverging_run_gives_the_same_records(dropout_on, tmp_path, monkeypatch):
    """Under a memory cap a group trains in parts; a member whose loss goes NaN leaves the group at once. Neither
    changes the others' records."""
    import peltbench.runner as runner

    methods = ["adapter", "lora", "unipelt_ap", "prefix"]
    whole = runner.run_group(runs(dropout_on, tmp_path / "whole", methods))
    monkeypatch.setattr(runner, "memory_cap", lambda cfgs, *args: 2)
    parts = runner.run_group(runs(dropout_on, tmp_path / "parts", methods))
    assert {o.record["fused"]["size"] for o in parts} == {2}
    for name, a, b in zip(methods, whole, parts):
        same_record(a.record, b.record, f"{name}: whole group vs in parts")
    monkeypatch.undo()
    diverging = runs(dropout_on, tmp_path / "nan", ["bitfit"], "method.lr=1e30")
    beside = runner.run_group([*runs(dropout_on, tmp_path / "nan", methods), *diverging])
    assert beside[-1].status == "failed" and "training loss became" in beside[-1].record["error"]
    for name, a, b in zip(methods, whole, beside):
        same_record(a.record, b.record, f"{name}: without vs beside a diverging run")


PELTBENCH = str(Path(sys.executable).with_name("peltbench"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}


def test_a_killed_fused_sweep_resumed_gives_the_records_of_an_uninterrupted_one(dropout_on, tmp_path, in_process):
    """kill -9 once the short runs of a fused sweep have their records: the rerun (in this process, from main() on)
    trains the others as a new, smaller group, and every record equals the uninterrupted sweep's (the same 6 runs in
    one group, trained in this process)."""
    from peltbench.runner import run_group

    checkpoint, glue = dropout_on
    methods, settings = ("adapter", "lora", "unipelt_apl"), ("fuse=true", "k=24", "train.patience=50", "device=auto")
    grid = ["-m", f"method={','.join(methods)}", "train.epochs=1,6", "task=rte", "dev_size=20", "train.batch_size=8",
            *settings, f"model.name={checkpoint}", f"data.dir={glue}", "logger=[]"]

    def sweep(results: str, name: str) -> subprocess.Popen:
        return subprocess.Popen([PELTBENCH, *grid, f"results_dir={results}", f"hydra.sweep.dir={name}"],
                                cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def records(results: str) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((tmp_path / results).rglob("result.json"))]

    killed = sweep("resumed", "sweeps/killed")
    deadline = time.monotonic() + 240
    while len(records("resumed")) < 3 and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)  # the three 1-epoch runs are done, the 6-epoch ones are training
    killed.wait()
    finished = records("resumed")
    assert len(finished) == 3 and {r["config"]["train"]["epochs"] for r in finished} == {1}
    assert {r["fused"]["size"] for r in finished} == {6}
    rerun = in_process(*grid, "results_dir=resumed", "hydra.sweep.dir=sweeps/rerun", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    run_group([cfg for name in methods for epochs in (1, 6)  # the sweep's order: Hydra's product of its lists
               for cfg in runs(dropout_on, tmp_path / "uninterrupted", [name], *settings, f"train.epochs={epochs}")])
    resumed, whole = records("resumed"), records("uninterrupted")
    assert len(resumed) == len(whole) == 6 and [r["variant"] for r in resumed] == [r["variant"] for r in whole]
    assert {r["fused"]["size"] for r in whole} == {6}
    assert sorted(r["fused"]["size"] for r in resumed) == [3, 3, 3, 6, 6, 6]  # re-formed as a group of 3
    for a, b in zip(resumed, whole):
        same_record(a, b, a["variant"])


@pytest.mark.slow
def test_fused_equals_separate_with_dropout_on_real_data(tmp_path):
    """MiniLM on the shipped RTE, 2 methods × 2 seeds, a few epochs: fused records equal separate ones."""
    from conftest import SHIPPED_GLUE as REAL_GLUE
    from peltbench.runner import run_group
    from test_real_data import minilm

    MINILM = minilm()
    if MINILM is None:
        pytest.skip("needs the MiniLM package (make install)")

    def cfgs(results, fuse):
        return [compose_config(f"method={m}", "task=rte", f"seed={s}", f"model.name={MINILM}", f"data.dir={REAL_GLUE}",
                               f"results_dir={results}", "k=32", "dev_size=64", "train.epochs=2", "logger=[]",
                               "device=cpu", f"fuse={str(fuse).lower()}", "train.max_length=64")
                for m in ("unipelt_apl", "lora") for s in (111, 222)]
    fused = run_group(cfgs(tmp_path / "fused", True))
    separate = [run_group([cfg])[0] for cfg in cfgs(tmp_path / "separate", False)]
    for a, b in zip(fused, separate):
        same_record(a.record, b.record, a.record["variant"])
