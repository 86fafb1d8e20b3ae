"""Defects an independent check found in the rendered tables, each pinned here (issue 8 item 2)."""
import csv
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from peltbench.tables import load_records, main
from peltbench.tables.figures import bottleneck_figure
from peltbench.tables.formatting import number, param_count, signed
from peltbench.tables.names import method_label
from test_tables import write_record, write_synthetic
from test_tables_output import markdown_body, markdown_rows

TASKS = ("sst2", "mrpc", "cola", "rte", "qnli", "stsb", "mnli", "qqp")


def render(tmp_path, runs, *options):
    out = tmp_path / "out"
    return main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path), *options]), out


def test_parameter_counts_round_as_the_paper_prints_them():
    # Table 4: 110M (fine-tuning's 109,482,240), 1.4M, 1.1M, 895K, 103K; MiniLM's 22,713,216 is 23M
    assert [param_count(n) for n in (109482240, 1410672, 1085000, 894528, 102913, 22713216, 999600)] == [
        "110M", "1.4M", "1.1M", "895K", "103K", "23M", "1M"]


def test_no_negative_zero():
    assert (number(-0.001), number(-0.0), signed(-0.004), number(-0.006)) == ("0.00", "0.00", "+0.00", "-0.01")


def test_bold_ranks_the_numbers_as_printed(tmp_path):
    # numpy rounds 52.535 up to 52.54, the table prints 52.53: the two cells read the same, so both are bold
    write_record(tmp_path, "adapter", "rte", 100, 111, 52.535)
    write_record(tmp_path, "lora", "rte", 100, 111, 52.53)
    write_record(tmp_path, "ft", "rte", 100, 111, 52.0)
    _, out = render(tmp_path, tmp_path, "--seeds", "1", "--ddof", "0")
    rows = markdown_rows((out / "table1.md").read_text())
    assert (rows["Adapter"][0], rows["LoRA"][0], rows["Fine-tuning"][0]) == ("**52.53**", "**52.53**", "<ins>52.00</ins>")


def test_methods_outside_the_paper_table_are_apart_and_unranked(tmp_path):
    write_record(tmp_path, "adapter", "rte", 100, 111, 60.0)
    write_record(tmp_path, "lora", "rte", 100, 111, 55.0)
    for method, score in (("ln", 90.0), ("mam", 80.0), ("mam_he", 85.0), ("unipelt_ap_nogate", 70.0), ("prefix_ln", 1.0)):
        write_record(tmp_path, method, "rte", 100, 111, score)
    _, out = render(tmp_path, tmp_path, "--seeds", "1", "--ddof", "0")
    text = (out / "table1.md").read_text()
    labels = [row[0] for row in markdown_body(text)]
    assert labels == ["Adapter", "LoRA", "*Not in the paper's Table 1 (not ranked):*", "UniPELT (AP)-NoGate",
                      "LN-tuning", "Prefix+LN", "MAM (LN-paper, L=8, r=8)", "MAM (He et al.)"]
    rows = markdown_rows(text)
    assert (rows["Adapter"][0], rows["LoRA"][0]) == ("**60.00**", "<ins>55.00</ins>")  # LN-tuning's 90 takes nothing
    assert rows["LN-tuning"][0] == "90.00" and rows["MAM (He et al.)"][0] == "85.00"
    assert "Rows below *Not in the paper's Table 1 (not ranked)* are methods the paper's Table 1 does not have" in text
    tex = (out / "table1.tex").read_text()
    assert r"\midrule" + "\n" + r"\multicolumn{3}{l}{\textit{Not in the paper's Table 1 (not ranked)}} \\" in tex
    assert "LN-tuning & 90.00 & 90.00" in tex


def test_every_method_has_a_label_and_a_place_in_the_rankings(tmp_path):
    """Issue 26 item 4: every method file has a display label and a row position; away from the paper (another model
    or protocol) every method is ranked, so AdaLoRA or OFT can take the bold."""
    from peltbench.packaged import options
    from peltbench.tables.names import METHOD_LABELS, METHODS

    assert set(options("method")) <= set(METHOD_LABELS) and set(options("method")) <= set(METHODS)
    assert len(set(METHOD_LABELS.values())) == len(METHOD_LABELS)  # no two methods read the same
    for method, score in (("lora", 60.0), ("adalora", 70.0), ("oft", 65.0), ("hra", 50.0)):
        write_record(tmp_path, method, "rte", 100, 111, score, model="/ckpt/mini")
    _, out = render(tmp_path, tmp_path, "--seeds", "1", "--ddof", "0")
    text = (out / "table1.md").read_text()
    rows = markdown_rows(text)
    assert [row[0] for row in markdown_body(text)] == ["LoRA", "AdaLoRA", "OFT", "HRA"]  # names.METHODS' order
    assert (rows["AdaLoRA"][0], rows["OFT"][0], rows["LoRA"][0]) == ("**70.00**", "<ins>65.00</ins>", "60.00")
    assert "Not in the paper's" not in text


def test_nogate_ap_is_a_paper_row_of_table3(tmp_path):
    for method, score in (("unipelt_ap", 80.0), ("unipelt_ap_nogate", 81.0), ("unipelt_apl_nogate", 99.0), ("bitfit", 98.0)):
        write_record(tmp_path, method, "rte", "all", 111, score)
    _, out = render(tmp_path, tmp_path)
    rows = markdown_rows((out / "table3.md").read_text())
    assert rows["UniPELT (AP)-NoGate"][0] == "**81.00**" and rows["UniPELT (AP)"][0] == "<ins>80.00</ins>"
    assert rows["BitFit"][0] == "98.00" and rows["UniPELT (APL)-NoGate"][0] == "99.00"  # not in the paper's Table 3


def test_two_mams_say_which_they_are():
    assert method_label("mam") == "MAM (LN-paper, L=8, r=8)"
    assert method_label("mam_he") == "MAM (He et al.)"


def efficiency_runs(root, **fused):
    """ft and adapter on CoLA and RTE: per step ft 1 s, adapter 0.5 s; per test example 0.01 s both."""
    for method, seconds in (("ft", 100.0), ("adapter", 50.0)):
        for task in ("cola", "rte"):
            write_record(root, method, task, 1000, 111, 50.0, train_seconds=seconds, train_steps=100, test_seconds=10.0,
                         test_examples=1000, trainable_params=109482240 if method == "ft" else 894528,
                         backbone_params=109482240, machine={"hostname": "n1", "cpu": "Xeon", "gpu": "H100"})


def test_table4_csv_keeps_exact_integers_and_prints_110m(tmp_path):
    efficiency_runs(tmp_path)
    _, out = render(tmp_path, tmp_path)
    with open(out / "table4.csv") as file:
        rows = {row["method"]: row for row in csv.DictReader(file)}
    assert (rows["ft"]["trainable_params"], rows["adapter"]["trainable_params"]) == ("109482240", "894528")
    assert rows["adapter"]["backbone_params"] == "109482240" and rows["adapter"]["setups"] == "2"
    assert markdown_rows((out / "table4.md").read_text())["Fine-tuning"][:3] == ["110M (100%)", "100%", "100%"]


def test_table4_tex_caption_matches_its_columns(tmp_path):
    efficiency_runs(tmp_path)
    _, out = render(tmp_path, tmp_path)
    tex = (out / "table4.tex").read_text()
    assert r"Method & \#Param. & Time$_T$ & Time$_I$ \\" in tex
    assert "setups" not in tex.split(r"\caption")[1].split("Timed on")[0].replace("the setups both methods ran", "")
    assert "Timed on: H100." in tex
    assert "Column setups:" in (out / "table4.md").read_text()


def test_fused_runs_count_in_parameters_but_not_in_times(tmp_path):
    efficiency_runs(tmp_path)
    # a fused adapter run on MRPC: its seconds are its group's (here 8x a real step), so they must not count
    write_record(tmp_path, "adapter", "mrpc", 1000, 111, 50.0, train_seconds=400.0, train_steps=100, test_seconds=10.0,
                 test_examples=1000, trainable_params=894528, backbone_params=109482240, fused={"group": "g1", "size": 8})
    write_record(tmp_path, "ft", "mrpc", 1000, 111, 50.0, train_seconds=100.0, train_steps=100, test_seconds=10.0,
                 test_examples=1000, trainable_params=109482240, backbone_params=109482240)
    _, out = render(tmp_path, tmp_path)
    adapter = markdown_rows((out / "table4.md").read_text())["Adapter"]
    assert adapter == ["895K (0.82%)", "50%", "100%", "2"]  # CoLA and RTE only: 0.5 s vs 1 s per step
    assert "1 fused run(s) (trained together on one backbone, so their seconds are their group's) count in \\#Param. " \
           r"but are left out of Time\_T and Time\_I." in (out / "table4.tex").read_text()


def test_outputs_of_an_earlier_render_are_removed(tmp_path):
    runs = write_synthetic(tmp_path / "runs")
    paper = Path(__file__).resolve().parents[1] / "results" / "paper"
    out = tmp_path / "out"
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(paper)]) == 0
    assert (out / "diff_table1.md").exists() and (out / "significance.md").exists()
    (out / "my_notes.txt").write_text("mine")
    shutil.rmtree(runs / "unipelt_ap"), shutil.rmtree(runs / "unipelt_apl")  # no UniPELT: no significance tests
    write_record(runs, "adapter", "cola", 100, 111, 10.0, variant="adapter,bottleneck=256", settings={"bottleneck": 256})
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path)]) == 0
    assert not (out / "diff_table1.md").exists() and not (out / "diff_table2.csv").exists()
    assert (out / "fig2_bottleneck.png").exists()
    assert (out / "my_notes.txt").read_text() == "mine"  # not a name this tool writes
    shutil.rmtree(runs / "adapter,bottleneck=256")  # one bottleneck size left: Figure 2 is not drawn, and not left behind
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path)]) == 0
    assert not (out / "fig2_bottleneck.png").exists()


@pytest.mark.parametrize("options, message", [
    (["--seeds", "0"], "--seeds 0: a cell expects at least 1 data seed"),
    (["--seeds", "5", "--ddof", "5"], "--ddof 5: must be at least 0 and below --seeds (5)"),
    (["--ddof", "-1"], "--ddof -1: must be at least 0"),
    (["--seeds", "three"], "argument --seeds: invalid int value: 'three' (see peltbench-tables --help)"),
])
def test_bad_options_are_one_line_and_status_2(tmp_path, capsys, options, message):
    runs = write_synthetic(tmp_path / "runs")
    with pytest.raises(SystemExit) if "three" in options else _nothing() as raised:
        status = main(["--results-dir", str(runs), "--out", str(tmp_path / "out"), *options])
    error = capsys.readouterr().err
    assert (raised.value.code if raised else status) == 2
    assert error.count("\n") == 1 and message in error and error.startswith("peltbench-tables: ")
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_one_line_and_status_2(tmp_path, capsys):
    runs = write_synthetic(tmp_path / "runs")
    (tmp_path / "file").write_text("x")
    assert main(["--results-dir", str(runs), "--out", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == f"peltbench-tables: --out {tmp_path / 'file'} is a file, not a directory\n"


class _nothing:
    """A context manager that raises nothing: `with ... as raised` gives None."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def bottleneck_runs(root):
    for seed, (small, large) in {111: (2.0, 20.0), 222: (4.0, 24.0)}.items():
        write_record(root, "adapter", "cola", 100, seed, small)
        write_record(root, "adapter", "cola", 100, seed, large, variant="adapter,bottleneck=256", settings={"bottleneck": 256})
    write_record(root, "adapter", "cola", 100, 111, 9.0, variant="adapter,bottleneck=64", settings={"bottleneck": 64})


def test_figure_error_bars_honour_ddof_and_mark_single_seeds(tmp_path):
    bottleneck_runs(tmp_path)
    records = load_records(tmp_path)
    for ddof, spread in ((1, np.sqrt(2)), (0, 1.0)):  # bottleneck 48: 2 and 4
        axes = bottleneck_figure(records, ddof).axes[0]
        (bars,) = axes.collections
        low, high = bars.get_segments()[0][:, 1]
        assert (high - low) / 2 == pytest.approx(spread)
    axes = bottleneck_figure(records).axes[0]
    assert [text.get_text() for text in axes.texts] == ["n=1"]            # bottleneck 64 has one seed
    assert axes.texts[0].xy == (64.0, 9.0)
    assert "Adapter: n = 1 (one seed)" in [line.get_label() for line in axes.lines]


def test_console_counts_add_up(tmp_path, capsys):
    bottleneck_runs(tmp_path)                                                                   # 5 runs, 3 swept
    write_record(tmp_path, "adapter", "rte", 100, 111, 9.0, variant="adapter,bottleneck=256", settings={"bottleneck": 256})
    write_record(tmp_path, "lora", "rte", 100, 111, 9.0, variant="lora,lora_rank=4", settings={"lora_rank": 4})
    write_record(tmp_path / "trial", "adapter", "cola", 100, 111, 9.0, train={"epochs": 3})
    assert render(tmp_path, tmp_path)[0] == 0
    console = capsys.readouterr().out
    # in the tables: bottleneck-48 CoLA (2 seeds); in Figure 2: 256 (2) and 64 (1) on CoLA; the RTE adapter and
    # LoRA rank 4 are in no figure; the 3-epoch trial is another protocol
    assert ("8 records: 2 in the tables, 3 only in figures, 3 listed in other_runs.md (1 other model or protocol, "
            "2 non-default method settings in no figure)") in console
    listing = (tmp_path / "out" / "other_runs.md").read_text()
    assert "- Adapter with bottleneck=256: 1 run(s)" in listing and "- LoRA with lora_rank=4: 1 run(s)" in listing


def full_table(root):
    """Every method the tables know on every task, 2 seeds where 5 are expected (each cell then carries n=2),
    scores up to 99.99 and down to -10: the widest cells. One K per table is as wide as three."""
    rng = np.random.default_rng(0)
    methods = ("ft", "bitfit", "adapter", "prefix", "prefix_l50", "lora", "unipelt_ap", "unipelt_ap_nogate",
               "unipelt_apl", "unipelt_apl_nogate", "ln", "prefix_ln", "mam", "mam_he")
    for method in methods:
        for task in TASKS:
            for k in (100, "all"):
                for seed in (111, 222) if k != "all" else (111,):
                    write_record(root, method, task, k, seed, float(rng.uniform(-10, 99.99)), train_seconds=100.0,
                                 train_steps=100, test_seconds=10.0, test_examples=1000, trainable_params=1410672,
                                 backbone_params=109482240)
    return root


ACL = (r"\documentclass[11pt,twocolumn]{article}\usepackage[T1]{fontenc}\usepackage{booktabs,graphicx}"
       r"\setlength\textwidth{455.24pt}\setlength\columnsep{17.08pt}\setlength\columnwidth{219.08pt}"  # acl.sty's page
       r"\newsavebox\measure\begin{document}")


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed (apt-get install texlive-latex-recommended)")
def test_latex_tables_compile_and_fit_an_acl_page(tmp_path):
    _, out = render(tmp_path, full_table(tmp_path / "runs"))
    body = []
    for name in ("table1", "table2", "table3", "table4"):
        text = (out / f"{name}.tex").read_text()
        limit = r"\textwidth" if r"\begin{table*}" in text else r"\columnwidth"
        box = text[text.index(r"\resizebox"): text.index(r"\end{tabular}}") + len(r"\end{tabular}}")]
        body += [rf"\setlength\linewidth{{{limit}}}\sbox\measure{{\small\setlength{{\tabcolsep}}{{4pt}}{box}}}",
                 rf"\typeout{{WIDTH {name} \the\wd\measure\space LIMIT \the{limit}}}", rf"\input{{{out / name}.tex}}"]
    (tmp_path / "paper.tex").write_text(ACL + "\n".join(body) + r"\end{document}")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "Overfull" not in run.stdout
    widths = {name: (float(width), float(limit)) for name, width, limit in
              re.findall(r"WIDTH (\w+) ([\d.]+)pt LIMIT ([\d.]+)pt", run.stdout)}
    assert set(widths) == {"table1", "table2", "table3", "table4"}
    for name, (width, limit) in widths.items():
        assert width <= limit + 0.01, f"{name} is {width}pt wide, the page allows {limit}pt"


def test_latex_escapes_names_and_captions(tmp_path):
    write_record(tmp_path, "adapter", "rte", 100, 111, 60.0, model="/models/my_bert&co")
    _, out = render(tmp_path, tmp_path, "--model", "my_bert&co")
    tex = (out / "table1.tex").read_text()
    caption = tex.split(r"\caption{")[1]
    assert r"models/my\_bert\&co" in caption and r"\%" not in caption.replace(r"x100", "")
    assert "my_bert&co" not in tex


def test_gates_of_another_length_are_listed_and_skipped(tmp_path, capsys):
    # issue 15 item 6e: one record's adapter gates have 3 layers where the others have 2 (a record of another
    # layout, or edited by hand): the gate figure is drawn from the rest and the record is named
    for seed, adapter in ((111, [0.2, 0.4]), (222, [0.4, 0.6])):
        write_record(tmp_path, "unipelt_apl", "cola", 100, seed, 30.0, gates={"adapter": adapter, "prefix": [0.9, 0.8]})
    odd = write_record(tmp_path, "unipelt_apl", "cola", 100, 333, 30.0, gates={"adapter": [0.1, 0.1, 0.1], "prefix": [0.5, 0.5]})
    status, out = render(tmp_path, tmp_path)
    assert status == 0 and (out / "fig_gates.png").is_file()
    from peltbench.tables.figures import gate_figure

    axes = gate_figure(load_records(tmp_path)).axes[0]
    assert [list(line.get_ydata()) for line in axes.lines] == [pytest.approx([0.3, 0.5]), pytest.approx([0.9, 0.8])]
    assert axes.get_title() == "CoLA (n = 2)"
    note = f"fig_gates.png leaves out 1 record whose gates have another number of layers than the rest: {odd} (adapter: 3 layers, not 2)"
    assert note in capsys.readouterr().out
    assert note in (out / "README.md").read_text()


def test_a_run_without_training_steps_has_no_time_ratio(tmp_path):
    # issue 15 item 6f: `train_steps: 0` (or `test_examples: 0`) is no time per step: left out, never inf%
    efficiency_runs(tmp_path)
    write_record(tmp_path, "adapter", "mrpc", 1000, 111, 50.0, train_seconds=3.0, train_steps=0, test_seconds=10.0,
                 test_examples=0, trainable_params=894528, backbone_params=109482240)
    write_record(tmp_path, "ft", "mrpc", 1000, 111, 50.0, train_seconds=100.0, train_steps=100, test_seconds=10.0,
                 test_examples=1000, trainable_params=109482240, backbone_params=109482240)
    _, out = render(tmp_path, tmp_path)
    table = (out / "table4.md").read_text()
    assert "inf%" not in table
    assert markdown_rows(table)["Adapter"] == ["895K (0.82%)", "50%", "100%", "2"]  # CoLA and RTE only
    assert "1 run(s) record no training steps: left out of Time_T. 1 run(s) record no test examples: left out of Time_I." in table
