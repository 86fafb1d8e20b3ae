"""Published GLUE tables beyond UniPELT beside ours (issue 20 item 5): results/paper/published/, rendered with tiny
synthetic records of the tables' model."""
import shutil
from pathlib import Path

import pytest

from peltbench import UserError

from peltbench.tables.command import main
from peltbench.tables.published import load_published, matching_table
from test_tables import write_record

PAPER = Path(__file__).resolve().parents[1] / "results" / "paper"


def header(text):
    line = next(line for line in text.splitlines() if line.startswith("| Method"))
    return [cell.strip() for cell in line.split("|")[1:-1]]


def test_the_published_tables_are_copied_as_printed():
    tables = load_published(PAPER)
    assert sorted(tables) == ["deberta_v3_base_glue", "roberta_base_glue", "roberta_base_glue_c3a",
                              "roberta_base_glue_delora", "roberta_base_glue_road", "roberta_large_glue_road",
                              "roberta_large_lmbff"]
    roberta = tables["roberta_base_glue"].set_index("method")
    assert roberta.loc["vera", "rte"] == 78.7 and roberta.loc["fourierft", "params"] == 24000  # the CSV's own rows
    assert "hra" in set(tables["deberta_v3_base_glue"]["method"])  # hra_r8 as printed, hra in peltbench
    assert matching_table(tables, "FacebookAI/roberta-base") == "roberta_base_glue"
    assert matching_table(tables, "bert-base-uncased") is None


def test_ours_beside_the_published_numbers(tmp_path):
    """Issue 26 item 4: each column on the metric the paper prints (RoBERTa: MRPC accuracy, STS-B Pearson), ours with
    the paper's decimals (one)."""
    for seed, (rte, pearson, f1, accuracy) in enumerate([(70.0, 88.0, 91.0, 86.0), (72.0, 90.0, 92.0, 87.0),
                                                          (80.0, 91.0, 93.0, 88.5)]):
        write_record(tmp_path / "runs", "lora", "rte", "all", seed, rte, model="roberta-base",
                     test={"main": rte, "accuracy": rte})
        write_record(tmp_path / "runs", "lora", "stsb", "all", seed, 50.0, model="roberta-base",
                     test={"main": 50.0, "pearson": pearson, "spearman": 50.0})
        write_record(tmp_path / "runs", "lora", "mrpc", "all", seed, f1, model="roberta-base",
                     test={"main": f1, "f1": f1, "accuracy": accuracy})
    shutil.copytree(PAPER, tmp_path / "paper")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(tmp_path / "paper"),
                 "--seeds", "3"]) == 0
    text = (out / "published_roberta_base_glue.md").read_text()
    # the mean of 70, 72, 80 beside the printed 78.4; STS-B on Pearson, MRPC on accuracy (the table's metrics), not
    # the main Spearman and F1; one decimal, as the paper prints
    [lora] = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| LoRA ")]
    assert lora == ["LoRA", "– [95.1]", "87.2 (n = 3) [89.7]", "– [63.4]", "– [93.3]", "74.0 (n = 3) [78.4]",
                    "89.7 (n = 3) [91.5]", "– [85.2]"]  # no average of ours without every task
    assert header(text) == ["Method", "SST-2 (Acc.)", "MRPC (Acc.)", "CoLA (MCC)", "QNLI (Acc.)", "RTE (Acc.)",
                            "STS-B (Pearson)", "Avg."]
    assert "| vera " in text.lower() and "protocol full_median" in text  # a published row without runs shows too
    assert "Warning: these runs are of protocol unipelt, the published table's is full_median" in text


def test_a_model_with_two_published_tables_gets_both_and_c3a_s_always_warns(tmp_path):
    """RoBERTa-base has the FourierFT/VeRA table (full_median) and the C3A paper's (issue 34 item 5): a render writes
    both; C3A's protocol is none of peltbench's, so its caption names it and warns under any protocol."""
    from peltbench.tables.published import matching_tables

    tables = load_published(PAPER)
    assert matching_tables(tables, "roberta-base")[:2] == ["roberta_base_glue", "roberta_base_glue_c3a"]
    c3a = tables["roberta_base_glue_c3a"].set_index("method")
    assert c3a.loc["c3a", "params"] == 111_000 and c3a.loc["c3a", "rte"] == 77.18  # b = 768/6: our c3a.yaml
    assert c3a.loc["c3a", "avg"] == 83.84 and c3a.loc["c3a_b768", "params"] == 18_000
    for seed, rte in enumerate([76.0, 78.0, 79.0]):
        write_record(tmp_path / "runs", "c3a", "rte", "all", seed, rte, model="roberta-base",
                     test={"main": rte, "accuracy": rte})
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(PAPER),
                 "--seeds", "3"]) == 0
    text = (out / "published_roberta_base_glue_c3a.md").read_text()
    [row] = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| C3A ")]
    assert row[5] == "77.67 (n = 3) [77.18]"  # the mean of 76, 78, 79, two decimals as the paper prints
    assert "the published table's is the C3A paper's own (a validation split selects" in text
    fourier = (out / "published_roberta_base_glue.md").read_text()
    assert "| C3A " in fourier and "| FourierFT " in fourier  # ours beside the other table too; its published row


def test_each_printed_average_is_the_mean_of_its_row():
    """A typo in a transcribed cell shows in its row's average: the mean of the row's printed cells is within one unit
    of the printed average's last decimal (the cells' rounding and the average's own, at most half a unit each)."""
    for stem, table in load_published(PAPER).items():
        average = next((column for column in ("avg", "all") if column in table.columns), None)
        if average is None:  # LM-BFF's Table 3 prints no average
            continue
        for _, row in table.iterrows():
            unit = 10.0 ** -len(table.attrs["printed"][(row["method"], average)].partition(".")[2])
            assert abs(row[list(table.attrs["metrics"])].mean() - row[average]) <= unit + 1e-9, (stem, row["method"])


def _halves_record(root, method, task, seed, accuracy, protocol="full_halves", k="all", model="roberta-base",
                   overrides=(), test=None):
    """A record of `protocol` (full_halves) on `model` (roberta-base), its config the composed one (so its protocol
    label is real)."""
    import json

    from omegaconf import OmegaConf

    from conftest import compose_config

    config = OmegaConf.to_container(compose_config(f"protocol={protocol}", f"method={method}", f"task={task}", f"k={k}",
                                                   f"seed={seed}", f"model.name={model}", *overrides), resolve=True)
    config.pop("hydra", None)
    folder = root / "-".join([method, *overrides]) / task / f"k{k}" / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({
        "method": method, "variant": method, "task": task, "k": k, "seed": seed, "model": model,
        "status": "ok", "test": test or {"main": accuracy, "accuracy": accuracy}, "dev_best": {"main": accuracy},
        "precision": "fp32", "config": config}))


def test_road_and_delora_tables_stand_beside_full_halves_runs(tmp_path):
    """Issue 34 item 5: the RoAd paper's Table 2 (RoBERTa-base and -large) and the DeLoRA paper's Table 4 split GLUE
    dev as ReFT does (protocol full_halves): runs of that protocol stand beside them without a warning, and beside the
    full_median tables with one. The paper's RoAd row (road_all: RoAd1 on every Linear) is our `road`: one row."""
    from peltbench.tables.published import matching_tables

    tables = load_published(PAPER)
    assert matching_tables(tables, "roberta-base") == ["roberta_base_glue", "roberta_base_glue_c3a",
                                                        "roberta_base_glue_road", "roberta_base_glue_delora"]
    assert matching_tables(tables, "FacebookAI/roberta-large") == ["roberta_large_glue_road", "roberta_large_lmbff"]
    road, delora = (tables[stem].set_index("method") for stem in ("roberta_base_glue_road", "roberta_base_glue_delora"))
    assert road.loc["road", "params_percent"] == 0.07 and road.loc["road", "cola"] == 64.4
    assert road.loc["road", "avg"] == 85.6 and "params_percent" not in road.attrs["metrics"]
    assert delora.loc["delora", "params"] == 300_000 and delora.loc["delora", "rte"] == 77.1
    assert delora.attrs["metrics"]["stsb"] == "pearson" and delora.attrs["metrics"]["qqp"] == "accuracy"
    for seed, rte in zip((42, 43, 44), (76.0, 78.0, 79.0)):
        _halves_record(tmp_path / "runs", "delora", "rte", seed, rte)
        _halves_record(tmp_path / "runs", "road", "rte", seed, rte - 2)
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(PAPER),
                 "--model", "roberta-base", "--protocol", "protocol=full_halves"]) == 0
    rows = {}
    for stem in ("roberta_base_glue_road", "roberta_base_glue_delora"):
        text = (out / f"published_{stem}.md").read_text()
        assert "Warning" not in text and "protocol full_halves" in text
        rows[stem] = {cells[0]: cells for cells in ([cell.strip() for cell in line.split("|")[1:-1]]
                                                    for line in text.splitlines() if line.startswith("| "))}
    assert rows["roberta_base_glue_delora"]["DeLoRA"][7] == "77.7 (n = 3) [77.1]"  # RTE: the mean of 76, 78, 79
    assert rows["roberta_base_glue_road"]["RoAd"][1] == "75.7 (n = 3) [78.9]"  # ours beside the paper's RoAd1
    assert "road_all" not in rows["roberta_base_glue_road"]
    assert "Warning: these runs are of protocol full_halves" in (out / "published_roberta_base_glue.md").read_text()


def test_deberta_on_its_printed_metrics_with_two_decimals(tmp_path):
    """QQP's 92.40 is accuracy (the table prints Acc/F1 and the CSV keeps Acc), MRPC accuracy, STS-B Pearson."""
    tables = load_published(PAPER)
    deberta = tables["deberta_v3_base_glue"]
    assert deberta.attrs["metrics"] == {"mnli": "accuracy", "sst2": "accuracy", "cola": "mcc", "qqp": "accuracy",
                                        "qnli": "accuracy", "rte": "accuracy", "mrpc": "accuracy", "stsb": "pearson"}
    assert tables["roberta_base_glue"].attrs["metrics"]["mrpc"] == "accuracy"
    assert deberta.attrs["printed"][("ft", "qqp")] == "92.40" and "metric" not in set(deberta["method"])
    model = "microsoft/deberta-v3-base"
    for seed in range(3):
        write_record(tmp_path / "runs", "ft", "qqp", "all", seed, 80.0, model=model,
                     test={"main": 80.0, "f1": 80.0, "accuracy": 90.0 + seed})
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(PAPER)]) == 0
    text = (out / "published_deberta_v3_base_glue.md").read_text()
    [ft] = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| Fine-tuning ")]
    assert ft[4] == "91.00 (n = 3) [92.40]"  # QQP accuracy (not the main F1, 80), two decimals
    assert header(text)[4] == "QQP (Acc.)" and "MNLI matched" in text


def test_a_csv_without_its_metric_row_is_one_line(tmp_path):
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "roberta_base_glue.csv").write_text("method,params,rte,avg\nlora,1,78.4,78.4\n")
    with pytest.raises(UserError, match="needs one `metric` row"):
        load_published(tmp_path)


def test_with_select_the_published_table_compares_the_chosen_setting(tmp_path):
    """Issue 26 item 3: after --select, ours beside the paper is each cell's chosen learning rate, and the caption
    says so."""
    for lr, (dev, test) in {4e-4: (60.0, 70.0), 5e-4: (80.0, 75.0)}.items():  # 5e-4: the better dev
        for seed in range(3):
            write_record(tmp_path / "runs", "lora", "rte", "all", seed, test + seed, model="roberta-base",
                         variant=f"lora_lr{lr}", settings={"lr": lr}, dev_best={"main": dev},
                         test={"main": test + seed, "accuracy": test + seed})
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(PAPER), "--seeds", "3",
                 "--select", "method.lr"]) == 0
    text = (out / "published_roberta_base_glue.md").read_text()
    [lora] = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| LoRA ")]
    assert lora[5] == "76.0 (n = 3) [78.4]"  # lr 5e-4 (dev 80): the mean of 75, 76, 77
    assert "Settings chosen on dev (--select method.lr)" in text


def test_our_average_over_every_task_beside_the_papers():
    from peltbench.tables.published import published_markdown

    table = load_published(PAPER)["roberta_base_glue"]
    scores = dict(zip(["sst2", "mrpc", "cola", "qnli", "rte", "stsb"], [90.0, 85.0, 60.0, 91.0, 70.0, 88.04]))
    text = published_markdown(table, {("lora", task): (value, 5) for task, value in scores.items()}, "roberta_base_glue", "")
    [lora] = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| LoRA ")]
    assert lora[-1] == f"{sum(scores.values()) / 6:.1f} [85.2]" == "80.7 [85.2]"


def _row(text, start):
    [cells] = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith(start)]
    return cells


def test_lmbff_table_3_beside_lmbff_runs_in_the_row_of_their_objective(tmp_path):
    """Issue 57 item 5: LM-BFF's Table 3 (RoBERTa-large, K = 16 per class) beside protocol=lmbff runs: the classifier
    runs of `ft` stand in its fine-tuning row, as mean (std) with LM-BFF's np.std (ddof 0) beside its mean (std); the
    prompt-based rows show the paper alone (their runs are renders of their own)."""
    table = load_published(PAPER)["roberta_large_lmbff"]
    assert table.attrs["metrics"] == {"sst2": "accuracy", "rte": "accuracy", "mrpc": "f1", "qnli": "accuracy"}
    assert table.attrs["printed"][((2, "ft"), "sst2")] == "92.7 (0.9)" and table.loc[2, "sst2"] == 92.7
    for seed, accuracy in zip((13, 21, 42), (80.0, 82.0, 87.0)):
        _halves_record(tmp_path / "runs", "ft", "sst2", seed, accuracy, protocol="lmbff", k=16, model="roberta-large")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(PAPER),
                 "--model", "roberta-large", "--protocol", "protocol=lmbff", "--seeds", "3"]) == 0
    text = (out / "published_roberta_large_lmbff.md").read_text()
    assert "Warning" not in text and "K = 16 runs" in text and "ddof 0" in text
    assert _row(text, "| Fine-tuning: ")[1] == "83.0 (2.9) (n = 3) [–]"  # np.std([80, 82, 87]) = 2.94
    assert _row(text, "| Prompt-based FT (man): ")[1:] == ["– [92.7 (0.9)]", "– [69.1 (3.6)]", "– [74.5 (5.3)]",
                                                           "– [64.5 (4.2)]"]
    assert "Warning: these runs are of protocol lmbff" in (out / "published_roberta_large_glue_road.md").read_text()
