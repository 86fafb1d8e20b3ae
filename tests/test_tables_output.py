"""What `peltbench-tables` writes: Markdown, LaTeX and CSV cells, notes, figures (peltbench.tables.command, ...).

Records are test_tables.SCORES (K = 100, CoLA and RTE, three seeds); the expected cells are the numbers
worked out there, formatted as the paper prints them.
"""
import csv
from pathlib import Path

import pytest

from peltbench.tables import main
from peltbench.tables.figures import bottleneck_figure, gate_figure, lora_scale_figure
from peltbench.tables.records import load_records
from test_tables import write_record, write_synthetic


def markdown_body(text):
    """The body rows (lists of stripped cells) of every pipe table in `text`, headers and rules left out."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and not set(cells[0]) <= set(":-") and cells[0] not in ("Method", "K"):
            rows.append(cells)
    return rows


def markdown_rows(text):
    """First cell -> the other cells, for tables whose first column is unique (one K, or method labels)."""
    return {row[0]: row[1:] for row in markdown_body(text)}


@pytest.fixture
def out(tmp_path):
    """Tables of the synthetic set with 3 seeds expected per cell, without the paper beside them."""
    folder = tmp_path / "tables"
    runs = write_synthetic(tmp_path / "runs")
    assert main(["--results-dir", str(runs), "--out", str(folder), "--seeds", "3", "--paper-dir", str(tmp_path)]) == 0
    return folder


def test_table1_markdown_cells(out):
    rows = markdown_rows((out / "table1.md").read_text())
    # columns: CoLA, RTE, Avg.; ** best, <ins> 2nd, * paired t-test p < 0.05 vs the best single method, n=2 < 3 seeds;
    # APL's CoLA is +22 on every seed: no variance, no t-test (n/a), so no star
    assert rows["Fine-tuning"] == ["20.00 ± 2.00", "<ins>60.00 ± 10.00</ins>", "<ins>40.00 ± 6.00</ins>"]
    assert rows["Prefix-tuning"] == ["0.00 ± 0.00", "**62.00 ± 2.00**", "31.00 ± 1.00"]
    assert rows["LoRA"] == ["13.00 ± 1.41 (n=2)", "59.00 ± 1.00", "35.75 ± 1.06 (n=2)"]
    assert rows["UniPELT (AP)"] == ["<ins>26.00 ± 1.00</ins> *", "**62.00 ± 1.00**", "**44.00 ± 1.00**"]
    assert rows["UniPELT (APL)"] == ["**42.00 ± 2.00**", "–", "–"]


def test_table1_lists_failed_runs_below(out):
    text = (out / "table1.md").read_text()
    assert "Runs left out, never averaged in: 1 failed, 0 with an undefined score." in text
    assert "- LoRA, CoLA, K = 100, seed 333: RuntimeError: boom" in text
    assert "% left out: lora, cola, K = 100, seed 333: RuntimeError: boom" in (out / "table1.tex").read_text()


def test_table1_latex_cells(out):
    lines = (out / "table1.tex").read_text().splitlines()
    rows = {line.split(" & ")[0]: line.removesuffix(r" \\").split(" & ")[1:] for line in lines if " & " in line}
    # as table1.md: `*` (Welch p < 0.05) on AP's and APL's CoLA, the seed count where fewer than 3 ran
    assert rows["UniPELT (AP)"] == [r"\underline{26.00}$_{1.00}^{\mathrm{*}}$", r"\textbf{62.00}$_{1.00}$", r"\textbf{44.00}$_{1.00}$"]
    assert rows["LoRA"] == [r"13.00$_{1.41}^{\mathrm{n=2}}$", "59.00$_{1.00}$", r"35.75$_{1.06}^{\mathrm{n=2}}$"]
    assert rows["UniPELT (APL)"] == [r"\textbf{42.00}$_{2.00}$", "--", "--"]
    assert r"\multicolumn{4}{c}{[$K = 100$] Test Performance} \\" in lines


def test_table1_csv_is_one_row_per_cell(out):
    with open(out / "table1.csv") as file:
        rows = {(row["method"], row["task"]): row for row in csv.DictReader(file)}
    assert len(rows) == 6 * 3  # 6 methods × (CoLA, RTE, Avg.)
    lora = rows["lora", "cola"]
    # rank: dense over CoLA's means 42, 26, 20, 13, 2, 0 (bold and underline are ranks 1 and 2)
    assert (lora["k"], lora["mean"], lora["std"], lora["n"], lora["failed"], lora["rank"]) == ("100", "13", "1.41421", "2", "1", "4")
    assert rows["unipelt_apl", "rte"]["n"] == "0"


def test_table2_markdown_bolds_the_larger_of_each_pair(out):
    # test_tables: max(A, P) 32 < UniPELT (AP) 44; max(A, P, L) 37.5 beside an APL without RTE
    assert markdown_rows((out / "table2.md").read_text())["100"] == ["32.00", "**44.00**", "37.50", "–"]


def test_significance_summary(out):
    text = (out / "significance.md").read_text()
    assert "- UniPELT (AP): significantly better in 1, significantly worse in 0 of 3 tested setups (0 n/a)." in text
    assert markdown_body(text) == [  # p-values as in test_tables.test_significance_against_the_best_single_method
        ["100", "CoLA", "UniPELT (AP)", "26.00", "Fine-tuning", "20.00", "+6.00", "paired (n=3)", "0.00913", "0.25 (0.25)", "*"],
        ["100", "RTE", "UniPELT (AP)", "62.00", "Prefix-tuning", "62.00", "+0.00", "paired (n=3)", "1", "1 (0.25)", ""],
        ["100", "Avg.", "UniPELT (AP)", "44.00", "Fine-tuning", "40.00", "+4.00", "paired (n=3)", "0.3", "0.5 (0.25)", ""],
        ["100", "CoLA", "UniPELT (APL)", "42.00", "Fine-tuning", "20.00", "+22.00", "paired (n=3)", "n/a", "0.25 (0.25)", ""],
    ]


def test_missing_tables_are_notes_and_index_lists_everything(out):
    assert ("No runs for this table yet under model bert-base-uncased (BERT) and protocol precision=fp32: "
            "`peltbench -m +experiment=table3 task=cola,rte precision=fp32`") in (out / "table3.md").read_text()
    # the render's precision, and its tasks (issue 32 item 6: a sweep of all 8 tasks fails where only these have data)
    index = (out / "README.md").read_text()
    for name in ("table1.md / .tex / .csv", "table2.md / .tex / .csv", "significance.md / .csv", "fig_gates.png"):
        assert f"`{name}`" in index
    assert not (out / "diff_table1.md").exists()  # no paper tables in --paper-dir


def test_paper_side_by_side(tmp_path):
    runs = write_synthetic(tmp_path / "runs")
    paper = Path(__file__).resolve().parents[1] / "results" / "paper"
    assert main(["--results-dir", str(runs), "--out", str(tmp_path / "tables"), "--paper-dir", str(paper)]) == 0
    rows = markdown_rows((tmp_path / "tables" / "diff_table1.md").read_text())
    # Fine-tuning K = 100 in the paper: CoLA 16.56, RTE 55.88, and an Avg. of 60.02 over 8 tasks
    assert rows["Fine-tuning"] == ["+3.44 (16.56)", "+4.12 (55.88)", "-20.02 (60.02)"]


def test_no_records_is_one_line_and_an_error(tmp_path, capsys):
    assert main(["--results-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "tables")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no usable result.json under" in error
    assert not (tmp_path / "tables").exists()


def test_figures_from_swept_runs(tmp_path):
    for seed, (small, large) in {111: (2.0, 20.0), 222: (4.0, 24.0)}.items():
        write_record(tmp_path, "adapter", "cola", 100, seed, small)  # bottleneck 48, the default
        write_record(tmp_path, "adapter", "cola", 100, seed, large, variant="adapter,bottleneck=256", settings={"bottleneck": 256})
        for scale in (1.0, 8.0):
            write_record(tmp_path, "lora", "stsb", 100, seed, scale, variant=f"lora,lora_scale={scale}", settings={"lora_scale": scale})
        write_record(tmp_path, "unipelt_apl", "cola", 100, seed, 30.0, gates={"adapter": [0.2, 0.4], "prefix": [0.9, 0.8]})
    records = load_records(tmp_path)
    for draw in (bottleneck_figure, lora_scale_figure, gate_figure):
        figure = draw(records)
        figure.savefig(tmp_path / f"{draw.__name__}.png")
        assert (tmp_path / f"{draw.__name__}.png").stat().st_size > 10_000
    bottleneck = bottleneck_figure(records).axes[0]
    assert list(bottleneck.lines[0].get_ydata()) == [3.0, 22.0]  # seed means at bottleneck 48 and 256
    gates = gate_figure(records).axes[0]
    assert [list(line.get_ydata()) for line in gates.lines] == [[0.2, 0.4], [0.9, 0.8]]  # adapter, prefix


def test_figures_need_a_sweep(tmp_path):
    write_record(tmp_path, "adapter", "cola", 100, 111, 2.0)  # one bottleneck size is no curve
    records = load_records(tmp_path)
    assert bottleneck_figure(records) is None
    assert lora_scale_figure(records) is None
    assert gate_figure(records) is None
