"""scripts/lmbff_sst2.py (issue 57 item 5): LM-BFF's SST-2 cells run end to end on a tiny RoBERTa masked LM that
stands in the Hugging Face cache as `roberta-large` (offline), so its renders put ours beside LM-BFF's Table 3. Its
commands run in this process (the `peltbench` and `peltbench-tables` entry points' main), not as processes of their
own: a process spends 5-10 s importing torch on 2 cores."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def script():
    spec = importlib.util.spec_from_file_location("lmbff_sst2", REPO / "scripts" / "lmbff_sst2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cached_roberta_large(home: Path) -> None:
    """A tiny RoBERTa masked LM (its vocabulary with LM-BFF's SST-2 label words) in the Hub cache as roberta-large."""
    from peltbench.tiny import save_tiny_encoder

    snapshot = home / "hub" / "models--roberta-large" / "snapshots" / "0"
    save_tiny_encoder("roberta", snapshot, masked_lm=True)
    (home / "hub" / "models--roberta-large" / "refs").mkdir()
    (home / "hub" / "models--roberta-large" / "refs" / "main").write_text("0")
    tokenizer = json.loads((snapshot / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["terrible"], vocab["great"] = vocab.pop("[unused0]"), vocab.pop("[unused1]")
    (snapshot / "tokenizer.json").write_text(json.dumps(tokenizer))


def test_the_script_runs_lmbffs_sst2_cells_beside_the_paper(tmp_path, monkeypatch, capsys):
    from peltbench import cli
    from peltbench.tables.command import main as tables_main
    from peltbench.data import load_split
    from peltbench.tiny import write_sentiment_task

    from huggingface_hub import constants

    cached_roberta_large(tmp_path / "hf")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))  # read once, at import
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    data = write_sentiment_task(tmp_path / "data", train_rows=64, test_rows=16)  # K = 16 per class, as the table
    commands = []

    def run(line, **_):
        """A command of the script, run as its entry point runs it."""
        from hydra.core.global_hydra import GlobalHydra

        commands.append(line)
        load_split.cache_clear()
        GlobalHydra.instance().clear()  # a process of its own starts without it
        monkeypatch.setattr(sys, "argv", [Path(line[0]).name, *line[1:]])
        try:
            status = tables_main(line[1:]) if Path(line[0]).name == "peltbench-tables" else cli.main()
        except SystemExit as exit:
            status = exit.code
        return subprocess.CompletedProcess(line, status or 0)

    lmbff_sst2 = script()
    monkeypatch.setattr(lmbff_sst2, "run_command", run)
    out = tmp_path / "tables"
    assert lmbff_sst2.main(["--data-dir", str(data), "--results-dir", str(tmp_path / "runs"), "--out", str(out),
                            "--seeds", "13", "--lrs", "1e-3", "1e-4", "--set", "train.max_steps=2",
                            "--set", "train.eval_every=1"]) == 0
    printed = capsys.readouterr().out
    assert "zero-shot: test accuracy" in printed
    assert [Path(line[0]).name for line in commands] == ["peltbench", "peltbench-tables"] * 2
    assert "objective.demonstrations=true" in commands[2] and "method.lr=0.001,0.0001" in commands[0]
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["zero-shot"] <= 100
    [prompt] = [row for row in summary["prompt"] if row.startswith("| Prompt-based FT (man)")]
    assert "(n = 1) [92.7 (0.9)]" in prompt  # ours at the learning rate chosen on dev, beside the paper's SST-2
    [demo] = [row for row in summary["prompt-demo"] if row.startswith("| + demonstrations")]
    assert "(n = 1) [–]" in demo
    assert len(list((tmp_path / "runs").rglob("result.json"))) == 4
    text = (out / "prompt" / "published_roberta_large_lmbff.md").read_text()
    assert "these runs depart from protocol lmbff (train.max_steps=2,train.eval_every=1)" in text
