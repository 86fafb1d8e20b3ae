"""scripts/generate_records.py writes what peltbench would write (issue 39, 3): at a small N, peltbench-missing counts
every generated record done and the tables read and tabulate every one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from peltbench.missing import main as missing
from peltbench.tables.command import main as tables
from peltbench.tables.records import read_records

REPO = Path(__file__).resolve().parents[1]
GRID = ["method=lora,adapter", "task=rte,cola", "seed=111,222", "k=100"]


def generator():
    spec = importlib.util.spec_from_file_location("generate_records", REPO / "scripts" / "generate_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_records_are_done_and_tabled(tmp_path, capsys):
    results = tmp_path / "runs"
    written = generator().work((0, 1, results, REPO / "tests" / "data" / "tables" / "minilm_runs",
                                [*GRID, f"results_dir={results}"]))
    paths = sorted(results.rglob("result.json"))
    assert written == len(paths) == 8
    record = json.loads(paths[0].read_text())
    assert record["status"] == "ok" and record["identity"]["method"]["name"] == record["method"]
    assert "hydra" not in record["config"]  # as the task function has its config

    assert missing([*GRID, f"results_dir={results}"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "8 runs: 8 done, 0 failed, 0 missing"

    frame, unreadable = read_records(results)
    assert unreadable == [] and len(frame) == 8 and set(frame["status"]) == {"ok"}
    assert tables(["--results-dir", str(results), "--out", str(tmp_path / "tables")]) == 0
    assert "8 records: 8 in the tables" in capsys.readouterr().out

    again = generator().work((0, 1, results, REPO / "tests" / "data" / "tables" / "minilm_runs",
                              [*GRID, f"results_dir={results}"]))
    assert again == 0  # a second run keeps the records there
