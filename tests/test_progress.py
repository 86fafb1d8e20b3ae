"""Progress: a tqdm bar in a terminal, periodic log lines elsewhere (never bar redraws), nothing with TQDM_DISABLE=1."""

from __future__ import annotations

import io
import os
import subprocess
import logging
import re
import sys

import pytest

from conftest import compose_config, tiny_run_overrides
from peltbench import progress as progress_module
from peltbench.progress import duration, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def log_file(monkeypatch, caplog):
    """stderr is not a terminal (as under SLURM or `| tee`), progress is on, and every update may log."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    caplog.set_level(logging.INFO, logger="peltbench")
    return caplog


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if " · " in r.getMessage()]


def test_log_lines_name_the_outer_loop_and_give_rate_and_eta(log_file, monkeypatch):
    """Issue 21, 3j: a line gave the inner loop's ETA only (none for the run), and `ETA 0s` as a loop ended."""
    now = [1e9]  # after every real reading (the last line's time among them)
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(progress_module._LastLine, "at", 0.0)  # restored after: later tests read the real clock
    epochs = progress(total=5, desc="epoch", unit="epoch", lines=False, outermost=True)
    for _ in progress(range(4), "train", unit="step", advances_outer=True):
        now[0] += 10.0
    epochs.update()
    for _ in progress(range(2), "dev", unit="batch"):
        now[0] += 5.0
    epochs.close()
    assert lines(log_file) == [
        "epoch 1/5 · train 1/4 steps · 10.0 s/step · ETA 30s · run ETA ≤ 3m",  # 4.75 epochs left at 40 s an epoch
        "epoch 1/5 · train 2/4 steps · 10.0 s/step · ETA 20s · run ETA ≤ 3m",
        "epoch 1/5 · train 3/4 steps · 10.0 s/step · ETA 10s · run ETA ≤ 3m",
        "epoch 1/5 · train 4/4 steps · 10.0 s/step · done in 40s · run ETA ≤ 3m",  # 4 epochs × 40 s
        "epoch 2/5 · dev 1/2 batches · 5.0 s/batch · ETA 5s · run ETA ≤ 3m",  # 1 epoch in 45 s: 4 × 45 s
        "epoch 2/5 · dev 2/2 batches · 5.0 s/batch · done in 10s · run ETA ≤ 3m"]  # the epoch loop logs nothing itself


def test_the_silence_counts_from_the_first_line_logged_not_from_import(tmp_path):
    """Issue 21, 3j: a `tokenise ... ETA 0s` line came 0.5 s after start: lines logged before the first loop began
    (`run: ...`) did not count, so the silence ran from import."""
    script = ("import logging, sys, time\nfrom peltbench import progress as p\np.LOG_EVERY_S = 0.5\n"
              "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
              "time.sleep(0.6)\nlogging.getLogger('peltbench').info('run: x')\n"
              "for _ in p.progress(range(3), 'tokenise', unit='row'): pass\n")
    env = {key: value for key, value in os.environ.items() if key != "TQDM_DISABLE"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert (result.returncode, result.stdout) == (0, "run: x\n"), result.stderr


def test_a_log_line_waits_until_nothing_was_logged_for_log_every_s(log_file, monkeypatch):
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 3600.0)
    for _ in progress(range(50), "dev", unit="batch"):
        pass
    assert lines(log_file) == []


def test_tqdm_disable_silences_bars_and_lines(log_file, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr("sys.stderr", Terminal())
    bar = progress(range(3), "dev", unit="batch")
    assert bar.bar is None and list(bar) == [0, 1, 2]
    assert lines(log_file) == [] and sys.stderr.getvalue() == ""


def test_a_terminal_gets_a_bar_and_log_lines_go_above_it(monkeypatch, log_file):
    monkeypatch.setattr("sys.stderr", Terminal())
    console = logging.StreamHandler(sys.stderr)  # as Hydra's console handler
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [console])
    bar = progress(range(3), "dev", unit="batch")
    assert bar.bar is not None and root.handlers != [console]  # while a bar is open, tqdm.write prints the log
    assert list(bar) == [0, 1, 2]
    assert root.handlers == [console] and lines(log_file) == []  # a bar, not log lines


def test_outermost_closes_what_a_crashed_loop_left_open(log_file):
    progress(total=9, desc="epoch", unit="epoch", lines=False)  # never closed: its run crashed
    epochs = progress(total=3, desc="epoch", unit="epoch", lines=False, outermost=True)
    for _ in progress(range(1), "test", unit="batch"):
        pass
    epochs.close()
    assert lines(log_file)[0].startswith("epoch 1/3 · test 1/1 batches")  # a log line's outer loops: the open ones


@pytest.mark.parametrize("seconds,text", [(0.4, "0s"), (45, "45s"), (65, "1m05s"), (3600 * 2 + 180, "2h03m")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_a_run_logs_its_training_and_evaluation(log_file, tiny_checkpoint, glue_dir, tmp_path):
    from peltbench.runner import run_experiment

    cfg = compose_config("method=lora", "task=rte", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path))
    run_experiment(cfg, tmp_path)
    logged = lines(log_file)
    assert "epoch 1/3 · train 1/1 steps" in "\n".join(logged)  # k=16, batch 16
    assert any(line.startswith("epoch 1/3 · dev 1/1 batches") for line in logged)
    assert any(re.match(r"epoch [23]/3 · test 1/1 batches", line) for line in logged)  # after its last epoch


def test_tokenising_logs_its_rows(log_file, tiny_checkpoint):
    import numpy as np
    from transformers import AutoTokenizer

    from peltbench.data import Split, encode

    split = Split((["the cat sat"] * 5000,), np.zeros(5000, dtype=np.int64), "test")
    encode(split, range(5000), AutoTokenizer.from_pretrained(tiny_checkpoint), 16)
    assert [line.split(" · ")[0] for line in lines(log_file)] == ["tokenise 4096/5000 rows", "tokenise 5000/5000 rows"]
