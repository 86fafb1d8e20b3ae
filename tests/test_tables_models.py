"""Tables of a model other than the paper's (issue 13 item 4): our numbers alone, counted on that model.

The paper's numbers ("ours − paper", Table 4's paper columns) stand beside renders of bert-base-uncased only;
Table 4's percentages divide each model's own counts. The counts below are `peltbench-params` on each model's
config.json (RoBERTa-base: vocab 50,265, 514 positions, one token type; its head's dense layer is new, so the
backbone is RobertaModel without a pooler).
"""
from pathlib import Path

import pytest

from peltbench.tables import load_records, main
from test_tables import write_record
from test_tables_output import markdown_rows

PAPER = Path(__file__).resolve().parents[1] / "results" / "paper"
COUNTS = {  # trainable_params per method, and backbone_params
    "roberta-base": ({"ft": 124_055_040, "adapter": 894_528, "lora": 294_912}, 124_055_040),
    "bert-base-uncased": ({"ft": 109_482_240, "adapter": 894_528, "lora": 294_912}, 109_482_240),
}
SECONDS_PER_STEP = {"ft": 1.0, "adapter": 0.6, "lora": 0.5}
NOT_SHOWN = ("The paper's numbers are not shown (no ours − paper tables, no paper columns in Table 4): the paper "
             "used bert-base-uncased; this render pools roberta-base (RoBERTa).")


def write_model_runs(root, model, architecture=None):
    """ft, adapter and LoRA on RTE at K = 100 (seeds 111, 222) and fine-tuning at K = all, with the model's counts;
    `architecture` None: a record written before records named it."""
    params, backbone = COUNTS[model]
    named = {"architecture": architecture} if architecture else {}
    setups = [(method, 100, seed) for method in params for seed in (111, 222)] + [("ft", "all", 111)]
    for method, k, seed in setups:
        write_record(root / model, method, "rte", k, seed, 60.0 + seed / 111, model=model,
                     trainable_params=params[method], backbone_params=backbone,
                     train_seconds=100 * SECONDS_PER_STEP[method], train_steps=100, test_seconds=2.0, test_examples=200,
                     **named)
    return root


def render(tmp_path, *options):
    out = tmp_path / "out"
    return main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(PAPER), *options]), out


@pytest.fixture
def two_models(tmp_path):
    runs = tmp_path / "runs"
    write_model_runs(runs, "roberta-base", "roberta")
    write_model_runs(runs, "bert-base-uncased")
    return runs


def test_another_model_renders_our_numbers_alone(tmp_path, two_models, capsys):
    status, out = render(tmp_path, "--model", "roberta-base")
    assert status == 0
    assert not list(out.glob("diff_table*"))  # the paper's tables are at hand, but not the paper's model
    index = (out / "README.md").read_text()
    assert NOT_SHOWN in index and "Warning" not in index and str(PAPER) not in index
    assert "Runs pooled: model roberta-base (RoBERTa; chosen with --model)" in index
    console = capsys.readouterr().out
    assert console.count(NOT_SHOWN) == 1 and "ours - paper comparison is skipped" not in console
    table4 = (out / "table4.md").read_text()
    assert "(paper)" not in table4 and "Warning" not in table4
    # 100 × 894,528 / 124,055,040 = 0.72% (on BERT-base's 109,482,240 it would be 0.82%); times: 0.6 s vs 1 s per step
    assert markdown_rows(table4) == {"Fine-tuning": ["120M (100%)", "100%", "100%", "2"],
                                     "LoRA": ["295K (0.24%)", "50%", "100%", "1"],
                                     "Adapter": ["895K (0.72%)", "60%", "100%", "1"]}
    assert "% of the backbone's parameters: 124,055,040)" in table4
    assert "% of the backbone's parameters: 124,055,040)" in (out / "table4.tex").read_text()


def test_the_papers_model_keeps_the_papers_numbers(tmp_path, two_models, capsys):
    status, out = render(tmp_path)  # bert-base-uncased by default; its records predate `architecture`: BERT
    assert status == 0
    assert {path.name for path in out.glob("diff_table*.md")} == {"diff_table1.md", "diff_table2.md", "diff_table3.md"}
    index = (out / "README.md").read_text()
    assert "not shown" not in index and f"the paper's own tables: `{PAPER}`" in index
    assert "Runs pooled: model bert-base-uncased (BERT; the paper's model)" in index
    assert "not shown" not in capsys.readouterr().out
    table4 = markdown_rows((out / "table4.md").read_text())
    assert table4["Adapter"] == ["895K (0.82%)", "895K (0.81%)", "60%", "55%", "100%", "107%", "1"]  # ours, paper's
    # the other model's runs are listed with its architecture and the options that render it
    assert "| roberta-base (RoBERTa) | precision=fp32 | 7 (0)" in (out / "other_runs.md").read_text()


def test_another_models_protocol_departure_is_no_paper_warning(tmp_path):
    runs = tmp_path / "runs"
    write_model_runs(runs, "roberta-base", "roberta")
    write_record(runs / "trial", "adapter", "rte", 100, 111, 50.0, model="roberta-base", architecture="roberta",
                 train={"epochs": 3})
    status, out = render(tmp_path, "--protocol", "train.epochs=3")
    assert status == 0 and not list(out.glob("diff_table*"))
    index = (out / "README.md").read_text()
    assert NOT_SHOWN in index and "Warning" not in index


def test_architecture_is_read_and_older_records_are_bert(tmp_path):
    write_record(tmp_path / "new", "ft", "rte", 100, 111, 60.0, model="roberta-base", architecture="roberta")
    write_record(tmp_path / "old", "ft", "rte", 100, 111, 60.0)
    records = load_records(tmp_path).set_index("model")
    assert records.loc["roberta-base", "architecture"] == "roberta"
    assert records.loc["bert-base-uncased", "architecture"] == "bert"
    write_record(tmp_path / "bad", "ft", "rte", 100, 222, 60.0, architecture=12)
    with pytest.warns(UserWarning, match="field 'architecture' is 12, expected a model_type"):
        assert len(load_records(tmp_path)) == 2


def test_one_model_path_with_two_architectures_is_never_pooled(tmp_path, capsys):
    """Issue 21, 3e: a checkpoint replaced in place (its records name BERT, then RoBERTa) pooled into one cell under
    the most common architecture's label. Its architectures are two models now, and the conflict is named."""
    runs = tmp_path / "runs"
    for seed, architecture, score in [(111, "bert", 60.0), (222, "bert", 62.0), (333, "roberta", 90.0)]:
        write_record(runs / architecture, "adapter", "rte", 100, seed, score, model="/ckpt/x", architecture=architecture)
    assert sorted(load_records(runs)["model"]) == ["/ckpt/x#bert", "/ckpt/x#bert", "/ckpt/x#roberta"]
    conflict = ("model /ckpt/x: its records name 2 architectures (BERT: 2 runs, RoBERTa: 1 run), a checkpoint replaced "
                "in place? Never pooled: they render apart as /ckpt/x#bert and /ckpt/x#roberta (--model chooses one)")
    status, out = render(tmp_path)
    assert status == 0
    assert capsys.readouterr().err.splitlines()[0] == f"peltbench-tables: warning: {conflict}"
    assert conflict in (out / "README.md").read_text()
    assert markdown_rows((out / "table1.md").read_text())["Adapter"][0] == "**61.00 ± 1.41** (n=2)"  # BERT's two
    assert "`peltbench-tables --model '/ckpt/x#roberta' --protocol precision=fp32`" in (out / "table1.md").read_text()
    assert render(tmp_path, "--model", "/ckpt/x")[0] == 2
    assert "--model /ckpt/x matches 2 models (/ckpt/x#bert, /ckpt/x#roberta)" in capsys.readouterr().err
    status, out = render(tmp_path, "--model", "/ckpt/x#roberta")
    assert status == 0 and markdown_rows((out / "table1.md").read_text())["Adapter"][0].startswith("**90.00")


def test_hints_name_the_model_and_protocol_they_render(tmp_path, capsys):
    """Issue 21, 3m: table3.md suggested `+experiment=table3` (56 bert-base-uncased runs from the Hub) for another
    model's render; empty Table 2, the significance table and Table 4's time columns gave no hint; Figure 2 was
    fixed to CoLA K = 100 and its title named neither model nor protocol."""
    runs = tmp_path / "runs"
    for seed in (111, 222):
        for variant, settings, score in (("adapter", None, 62.0), ("adapter,bottleneck=8", {"bottleneck": 8}, 60.0)):
            write_record(runs, "adapter", "mrpc", 500, seed, score + seed / 111, variant=variant, settings=settings,
                         model="/ckpt/mini", train={"epochs": 5}, dev_size=200)
    status, out = render(tmp_path, "--protocol", "train.epochs=5,dev_size=200")
    assert status == 0
    sweep = "task=mrpc model.name=/ckpt/mini train.epochs=5 dev_size=200 precision=fp32"  # the render's task only
    assert f"`peltbench -m +experiment=table3 {sweep}`, then `make tables`" in (out / "table3.md").read_text()
    # the K of the cells shown (MRPC K = 500), not the experiment file's three
    assert f"`peltbench -m +experiment=table2 k=500 {sweep}` runs them" in (out / "table2.md").read_text()
    assert f"`peltbench -m +experiment=table1 k=500 {sweep}` runs them" in (out / "significance.md").read_text()
    assert f"trained unfused (fuse=false): `peltbench -m +experiment=table4 {sweep}`" in (out / "table4.md").read_text()
    assert f"`peltbench -m +experiment=fig3_lora_scale {sweep}`" in (out / "README.md").read_text()
    from matplotlib import image

    assert image.imread(out / "fig2_bottleneck.png").shape[0] > 100  # drawn: MRPC K = 500, where the sweep ran


def test_figure_titles_name_the_runs_and_points_with_fewer_seeds_say_so(tmp_path):
    from peltbench.tables.figures import bottleneck_figure
    from peltbench.tables.outputs import _name_the_runs
    from peltbench.tables.comparability import Selection

    for seed in (111, 222):
        write_record(tmp_path, "adapter", "rte", 100, seed, 60.0 + seed / 111)
        write_record(tmp_path, "adapter", "rte", 100, seed, 61.0, variant="adapter,bottleneck=8", settings={"bottleneck": 8})
    figure = bottleneck_figure(load_records(tmp_path), expected=5)
    axes = figure.axes[0]
    assert axes.get_title() == "Figure 2: adapter bottleneck size (RTE, K = 100)"  # no CoLA K = 100 sweep: RTE's
    assert sorted(text.get_text() for text in axes.texts) == ["n=2", "n=2"]  # 2 of the 5 seeds expected
    selection = Selection("bert-base-uncased", "the paper's model", "precision=fp32", "", architecture="bert")
    assert _name_the_runs(figure, selection)._suptitle.get_text() == "bert-base-uncased (BERT), precision=fp32"


def test_records_of_a_custom_task_say_why_they_are_not_usable(tmp_path, capsys):
    write_record(tmp_path / "runs", "adapter", "mytask", 100, 111, 50.0)
    assert render(tmp_path)[0] == 1
    assert ("peltbench-tables: 1 record(s) of task mytask: the tables have rows for peltbench's methods and columns "
            "for the GLUE tasks only (cola, mnli, mrpc, qnli, qqp, rte, sst2, stsb)") in capsys.readouterr().err


def test_models_side_by_side_under_one_protocol(tmp_path, two_models, capsys):
    """Issue 21, 3n: two encoders could not be compared in one table."""
    status, out = render(tmp_path, "--models", "roberta-base,bert-base-uncased")
    assert status == 0, capsys.readouterr().err
    text = (out / "models.md").read_text()
    assert "Every model under the same protocol: the paper's protocol" in text
    rows = markdown_rows(text)
    header = [line for line in text.splitlines() if line.startswith("| Method")][0]
    assert [cell.strip() for cell in header.split("|")[2:-1]] == [
        "roberta-base (RoBERTa): RTE", "roberta-base (RoBERTa): Avg.", "bert-base-uncased (BERT): RTE",
        "bert-base-uncased (BERT): Avg."]
    # write_model_runs: 60 + seed / 111 for every model and method, seeds 111 and 222: 61.50 ± 0.71
    assert len(rows["Adapter"]) == 4 and all("61.50 ± 0.71" in cell and "(n=2)" in cell for cell in rows["Adapter"])
    assert not list(out.glob("table*"))  # the paper's tables are another render
    assert render(tmp_path, "--models", "roberta-base,bert-base-uncased", "--protocol", "train.epochs=3")[0] == 2
    assert "--models: no run of roberta-base (RoBERTa) under train.epochs=3,precision=fp32" in capsys.readouterr().err
