"""`peltbench-tables --select`: a method setting chosen on dev per method × task × K (issue 20 item 2), recomputed
here from the synthetic records with plain pandas."""
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from peltbench import UserError
from peltbench.tables.command import main
from peltbench.tables.records import load_records
from peltbench.tables.selection import chosen_cells, parse_keys, select_settings
from test_tables import write_record

# lora's lr grid on RTE: value -> {seed: (dev, test)}. 3e-4 has the best mean dev (70) but not the best test.
LORA = {1e-4: {111: (60, 55), 222: (62, 57)}, 3e-4: {111: (70, 58), 222: (70, 60)}, 5e-4: {111: (66, 66), 222: (64, 64)}}
# adapter: 1e-3 lacks seed 222; on the shared seed 111 1e-4 is better (dev 65 vs 61), though 1e-3's mean over
# its own seeds would not say so if 222 were counted alone.
ADAPTER = {1e-4: {111: (65, 50), 222: (40, 52)}, 1e-3: {111: (61, 70)}}


def write_grid(root):
    for method, grid, default in (("lora", LORA, 5e-4), ("adapter", ADAPTER, 1e-4)):
        for lr, seeds in grid.items():
            for seed, (dev, test) in seeds.items():
                settings = {"lr": lr} if lr != default else {}
                write_record(root / f"lr{lr}", method, "rte", 100, seed, test, variant=f"{method}_lr{lr}",
                             settings=settings, dev_best={"main": dev})
    write_record(root / "rank", "lora", "rte", 100, 111, 99, variant="lora_r4", settings={"lora_rank": 4},
                 dev_best={"main": 99})  # another setting changed: not a candidate of an lr selection
    return root


def test_the_chosen_setting_has_the_best_mean_dev_over_shared_seeds(tmp_path):
    runs = load_records(write_grid(tmp_path))
    chosen = select_settings(runs, ("lr",))
    rows = chosen.rows.set_index(["method", "value"])
    assert list(rows.loc["lora"].index) == ["0.0001", "0.0003", "0.0005"]  # every candidate, numeric order
    assert rows.loc[("lora", "0.0003"), "chosen"] and rows["chosen"].sum() == 2
    assert rows.loc[("lora", "0.0003"), "dev_mean"] == pytest.approx((70 + 70) / 2)
    assert rows.loc[("lora", "0.0003"), "test_mean"] == pytest.approx(59.0)
    assert rows.loc[("lora", "0.0003"), "test_std"] == pytest.approx(pd.Series([58, 60]).std(ddof=1))
    assert rows.loc[("lora", "0.0001"), "seeds"] == "111 222" and rows.loc[("lora", "0.0001"), "key"] == "method.lr"
    # adapter: compared on seed 111 only (the one both candidates have), and said so
    assert rows.loc[("adapter", "0.0001"), "dev_mean"] == 65 and rows.loc[("adapter", "0.0001"), "chosen"]
    assert rows.loc[("adapter", "0.001"), "missing_seeds"] == "222"
    assert rows.loc[("adapter", "0.0001"), "test_mean"] == pytest.approx(51.0)  # its own two seeds
    assert chosen.notes == ["adapter, rte, K = 100: missing seeds (0.001 lacks seed(s) 222): compared on the 1 seed(s) "
                            "all candidates share (111)"]
    median = chosen_cells(chosen, "median").set_index("method")
    assert median.loc["lora", "centre"] == pytest.approx(59.0) and median.loc["lora", "spread"] != median.loc["lora", "spread"]


def test_no_shared_seed_chooses_nothing(tmp_path):
    write_record(tmp_path, "lora", "rte", 100, 111, 50, variant="a", settings={"lr": 1e-4}, dev_best={"main": 50})
    write_record(tmp_path, "lora", "rte", 100, 222, 60, variant="b", settings={"lr": 3e-4}, dev_best={"main": 60})
    chosen = select_settings(load_records(tmp_path), ("lr",))
    assert not chosen.rows["chosen"].any() and "nothing chosen" in chosen.notes[0]


def test_keys(tmp_path):
    assert parse_keys(["method.lr,method.lora_rank", "method.lr"]) == ("lr", "lora_rank")
    with pytest.raises(UserError, match="only method settings"):
        parse_keys(["train.epochs"])
    with pytest.raises(UserError, match="no pooled run has method setting bogus"):
        select_settings(load_records(write_grid(tmp_path)), ("bogus",))


def test_several_keys_select_their_combination(tmp_path):
    runs = load_records(write_grid(tmp_path))
    rows = select_settings(runs, ("lr", "lora_rank")).rows
    lora = rows[rows["method"] == "lora"].set_index("value")
    assert list(lora.index) == ["0.0001,8", "0.0003,8", "0.0005,4", "0.0005,8"]  # rank 8: lora's default
    assert lora.loc["0.0005,4", "chosen"] and lora.loc["0.0005,4", "missing_seeds"] == "222"  # on seed 111: dev 99
    assert set(lora["key"]) == {"method.lr,method.lora_rank"}


def test_the_render_writes_selection_csv_md_tex(tmp_path, capsys):
    write_grid(tmp_path / "runs")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", "method.lr", "--seeds", "2"]) == 0
    csv = pd.read_csv(out / "selection.csv")
    assert list(csv.columns[:10]) == ["method", "task", "k", "key", "value", "seeds", "dev_mean", "test_mean", "test_std",
                                      "test_median"] and "chosen" in csv.columns and len(csv) == 5
    markdown = (out / "selection.md").read_text()
    assert "59.00 ± 1.41 [0.0003]" in markdown and "Selected on dev per method, task and K: method.lr" in markdown
    assert "0.001 lacks seed(s) 222" in markdown
    latex = (out / "selection.tex").read_text()
    assert r"59.00$_{1.41}$ {\scriptsize[0.0003]}" in latex and "0.001 lacks seed(s) 222" in latex
    assert "selection: adapter, rte" in capsys.readouterr().out
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", "train.epochs"]) == 2


def test_after_a_selection_paired_and_cost_compare_the_chosen_settings(tmp_path):
    write_grid(tmp_path / "runs")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", "method.lr",
                 "--baseline", "adapter", "--seeds", "2"]) == 0
    paired = pd.read_csv(out / "paired.csv")
    # lora at lr 3e-4 (test 58, 60) against adapter at 1e-4 (test 50, 52): paired over seeds 111 and 222
    assert paired[["method", "reference", "n", "difference"]].values.tolist() == [["lora", "adapter", 2, 8.0]]
    cost = pd.read_csv(out / "fig_cost.csv").set_index(["task", "method"])
    assert cost.loc[("rte", "lora"), "score"] == 59.0


def test_a_key_nobody_varied_is_refused_in_one_line(tmp_path, capsys):
    """Issue 26 item 3: `--select method.bottleneck` on an lr grid chose adapter's one bottleneck and exited 0."""
    write_grid(tmp_path / "runs")
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                 "--select", "method.bottleneck"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == ("peltbench-tables: --select method.bottleneck: no method, task and K has runs at two values of it "
                    "(adapter: 48 only), so nothing is chosen on dev; settings these runs vary: method.lora_rank, method.lr")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="--select method.lora_rank: no method, task and K has runs at two values"):
        # lora_rank 4 is one run at lr 5e-4 beside rank 8 at 5e-4: two values, but only with lr kept at its default
        select_settings(load_records(write_grid(tmp_path / "b")).query("variant != 'lora_lr0.0005'"), ("lora_rank",))


def test_a_method_outside_the_selection_is_named_never_dropped(tmp_path, capsys):
    """Without its default-lr runs, every LoRA run changes lr (or rank): a bottleneck selection has no candidate of
    LoRA's, and says so in the notes, the console and selection.md."""
    shutil.rmtree(write_grid(tmp_path / "runs") / "lr0.0005" / "lora_lr0.0005")
    for seed in (111, 222):
        write_record(tmp_path / "runs" / "bn", "adapter", "rte", 100, seed, 40.0, variant="adapter_bn8",
                     settings={"bottleneck": 8}, dev_best={"main": 90.0})
    runs = load_records(tmp_path / "runs")
    chosen = select_settings(runs, ("bottleneck",))
    assert ("lora, rte, K = 100: not in the selection: its 5 run(s) change method.lora_rank, method.lr (not selected; "
            "add it to --select to choose it too)") in chosen.notes
    out = tmp_path / "out"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", "method.bottleneck",
                 "--seeds", "2"]) == 0
    assert "lora, rte, K = 100: not in the selection" in (out / "selection.md").read_text()
    assert "selection: lora, rte, K = 100: not in the selection" in capsys.readouterr().out


def test_with_select_table1_shows_the_chosen_settings_and_says_so(tmp_path):
    """Issue 26 item 3: Table 1 stayed on the defaults (no LoRA row when LoRA had no default-lr run) while
    selection.md showed the chosen settings. Recomputed here with pandas from the records."""
    write_grid(tmp_path / "runs")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", "method.lr", "--seeds", "2"]) == 0
    runs = load_records(tmp_path / "runs")
    runs = runs[runs["changed"].map(lambda changed: set(changed) <= {"lr"})]
    lr = runs["settings"].map(lambda settings: settings["lr"])
    expected = {}
    for method, group in runs.assign(lr=lr).groupby("method"):
        shared = set.intersection(*(set(rows["seed"]) for _, rows in group.groupby("lr")))
        dev = group[group["seed"].isin(shared)].groupby("lr")["dev_main"].mean()
        best = dev[dev == dev.max()].index.min()
        expected[method] = group.loc[group["lr"] == best, "main"].mean()
    table = pd.read_csv(out / "table1.csv").query("task == 'rte'").set_index("method")
    assert set(table.index) == {"adapter", "lora"}
    for method, mean in expected.items():
        assert table.loc[method, "mean"] == pytest.approx(mean)
    assert table.loc["lora", "mean"] == pytest.approx(59.0)  # lr 3e-4, not the default 5e-4's 65
    caption = (out / "table1.md").read_text()
    assert "Settings chosen on dev (--select method.lr)" in caption
    assert "Settings chosen on dev (--select method.lr)" in (out / "table1.tex").read_text()
    assert "in selection.csv only" not in caption
    readme = (out / "README.md").read_text()
    assert "4 in the tables" in readme and "only in selection.csv (candidates not chosen)" in readme


def test_failed_cells_and_single_candidates_are_said(tmp_path):
    """A cell whose every candidate failed keeps its failures in Table 1 (never a silent gap); a method with one
    candidate per cell is named as not chosen on dev."""
    write_grid(tmp_path / "runs")
    for seed in (111, 222):
        write_record(tmp_path / "runs", "lora", "mrpc", 100, seed, None, variant="lora_mrpc", settings={"lr": 1e-4})
        write_record(tmp_path / "runs", "ft", "rte", 100, seed, 50.0, dev_best={"main": 50.0})
    runs = load_records(tmp_path / "runs")
    chosen = select_settings(runs, ("lr",))
    assert ("lora, mrpc, K = 100: no candidate has a dev and a test score (failed runs): nothing chosen, its runs are "
            "shown as they are") in chosen.notes
    assert any(note.startswith("ft: one candidate in each cell (method.lr = ") for note in chosen.notes)
    out = tmp_path / "out"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", "method.lr", "--seeds", "2"]) == 0
    table = pd.read_csv(out / "table1.csv").set_index(["method", "task"])
    assert table.loc[("lora", "mrpc"), "failed"] == 2 and table.loc[("ft", "rte"), "mean"] == 50.0


def figure_titles(monkeypatch):
    """{file name: title} of every figure a render saves."""
    from peltbench.tables.outputs import Output

    titles, save = {}, Output.figure

    def figure(self, name, figure):
        save(self, name, figure)
        titles[name] = figure._suptitle.get_text().replace("\n", " ")

    monkeypatch.setattr(Output, "figure", figure)
    return titles


def test_with_select_paired_md_and_the_cost_figures_say_the_settings_were_chosen_on_dev(tmp_path, monkeypatch):
    """Issue 32 item 4: with --select, paired.md and the cost figures were the default render's below its header."""
    for path in write_grid(tmp_path / "runs").rglob("result.json"):  # costs, so that the cost figures are drawn
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "trainable_params": 1000, "train_seconds": 10.0, "train_steps": 100}))
    titles = figure_titles(monkeypatch)
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", "method.lr", "--seeds", "2",
                 "--baseline", "adapter"]) == 0
    said = "Settings chosen on dev (--select method.lr)"
    assert said in (out / "paired.md").read_text()
    cost = [name for name in titles if name.startswith("fig_cost_")]
    assert cost and all(said in titles[name] for name in cost)
    index = (out / "README.md").read_text()
    assert all(said in line for line in index.splitlines() if line.startswith("| `fig_cost"))
    titles.clear()
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "default"), "--seeds", "2"]) == 0
    assert "chosen on dev" not in (tmp_path / "default" / "paired.md").read_text()
    assert not any("chosen on dev" in title for title in titles.values())


@pytest.mark.parametrize("keys, tables, candidates, other", [
    ("method.lr", 4, 5, 1),
    ("method.lr,method.lora_rank", 3, 7, 0),  # LoRA: rank 4 at the default lr (dev 99, seed 111 alone) is chosen
])
def test_candidates_not_chosen_are_only_in_selection_csv_when_every_cell_keeps_its_default(
        tmp_path, capsys, monkeypatch, keys, tables, candidates, other):
    """Issue 32 item 4: where dev chose each method's default, the other candidates were counted as 'non-default
    method settings in no figure' in the console and other_runs.md; docs/tables.md says only in selection.csv."""
    monkeypatch.setitem(LORA, 5e-4, {111: (80, 66), 222: (80, 64)})  # LoRA's default lr now has the best dev
    write_grid(tmp_path / "runs")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--select", keys, "--seeds", "2"]) == 0
    chosen = pd.read_csv(out / "selection.csv").query("chosen")
    if keys == "method.lr":  # each method's default chosen: no run in the tables changes a setting
        assert dict(zip(chosen["method"], chosen["value"].astype(str))) == {"adapter": "0.0001", "lora": "0.0005"}
    line = capsys.readouterr().out.splitlines()[-1]
    assert (f"10 records: {tables} in the tables, 0 only in figures, {candidates} only in selection.csv (candidates not "
            f"chosen), {other} listed in other_runs.md") in line
    listed = (out / "other_runs.md").read_text().split("## Non-default method settings that no figure plots")[1]
    listed = listed.split("##")[0]
    assert "lr=" not in listed
    assert ("LoRA with lora_rank=4: 1 run(s)" in listed) == (other == 1)


def test_a_candidates_dev_mean_is_pandas_mean_bit_for_bit():
    """The dev mean a candidate is chosen by, taken without a Series per candidate: equal to pandas' to the last bit
    (the order of numpy's pairwise sum kept, NaN as 0 in it), so no choice changes."""
    from peltbench.tables.selection import _mean

    rng = np.random.default_rng(7)
    differing = 0
    for size in (*range(1, 40), 128, 129, 334, 1000):
        values = rng.normal(60, 25, size) * rng.choice([1e-3, 1.0, 1e3], size)
        values[rng.random(size) < 0.2] = np.nan
        expected = pd.Series(values).mean()
        assert (np.isnan(_mean(values)) and np.isnan(expected)) or _mean(values) == expected, size
        differing += values[~np.isnan(values)].mean() != expected  # the mean of the others alone
    assert differing  # the check can tell: summing the non-NaN values alone differs from pandas for some sizes
    assert np.isnan(_mean(np.full(3, np.nan))) and np.isnan(_mean(np.array([])))


def test_a_candidates_test_median_is_numpys_bit_for_bit():
    """A candidate's test median (full_median's statistic), taken without numpy's partition per candidate: equal to
    np.median's to the last bit, odd and even counts, ties and signed zeros."""
    from peltbench.tables.selection import _median

    rng = np.random.default_rng(11)
    for size in (*range(1, 40), 334, 1001):
        for values in (rng.normal(60, 25, size) * rng.choice([1e-3, 1.0, 1e3], size),
                       rng.choice([0.0, -0.0, 1.5, 1e300, -1e300, 2.0 ** -1074], size)):
            expected = float(np.median(values))
            assert _median(values) == expected and np.signbit(_median(values)) == np.signbit(expected), (size, values)
