"""Published GLUE tables beyond UniPELT beside ours (issue 20 item 5): results/paper/published/, rendered with tiny
synthetic records of the tables' model."""
import shutil
from pathlib import Path

import pandas as pd

from peltbench.tables.command import main
from peltbench.tables.published import load_published, matching_table
from test_tables import write_record

PAPER = Path(__file__).resolve().parents[1] / "results" / "paper"


def test_the_published_tables_are_copied_as_printed():
    tables = load_published(PAPER)
    assert sorted(tables) == ["deberta_v3_base_glue", "roberta_base_glue"]
    roberta = tables["roberta_base_glue"].set_index("method")
    assert roberta.loc["vera", "rte"] == 78.7 and roberta.loc["fourierft", "params"] == 24000  # the CSV's own rows
    assert "hra" in set(tables["deberta_v3_base_glue"]["method"])  # hra_r8 as printed, hra in peltbench
    assert matching_table(tables, "FacebookAI/roberta-base") == "roberta_base_glue"
    assert matching_table(tables, "bert-base-uncased") is None


def test_ours_beside_the_published_numbers(tmp_path):
    for seed, (rte, pearson) in enumerate([(70.0, 88.0), (72.0, 90.0), (80.0, 91.0)]):
        write_record(tmp_path / "runs", "lora", "rte", "all", seed, rte, model="roberta-base")
        write_record(tmp_path / "runs", "lora", "stsb", "all", seed, 50.0, model="roberta-base",
                     test={"main": 50.0, "pearson": pearson, "spearman": 50.0})
    shutil.copytree(PAPER, tmp_path / "paper")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--paper-dir", str(tmp_path / "paper"),
                 "--seeds", "3"]) == 0
    text = (out / "published_roberta_base_glue.md").read_text()
    # the mean of 70, 72, 80 beside the printed 78.4; STS-B on Pearson (the table's metric), not the main Spearman
    [lora] = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| LoRA ")]
    assert lora == ["LoRA", "– [95.10]", "– [89.70]", "– [63.40]", "– [93.30]", "74.00 (n = 3) [78.40]", "89.67 (n = 3) [91.50]"]
    assert "| vera " in text.lower() and "protocol full_median" in text  # a published row without runs shows too
