"""The `peltbench` command end to end, as a user runs it, in a temporary directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_glue

PELTBENCH = str(Path(sys.executable).with_name("peltbench"))


def peltbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([PELTBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def common(workdir: Path) -> list[str]:
    return ["model.name=tiny-bert", "data.dir=glue", "k=16", "dev_size=20", "train.epochs=2"]


def records(workdir: Path) -> list[Path]:
    return sorted((workdir / "results").rglob("result.json"))


def test_run_skip_and_a_different_config(workdir, in_process):
    """The first run through the real command; the rerun and the other config in this process (in_process)."""
    run = peltbench("method=unipelt_apl", "task=mrpc", "seed=222", *common(workdir), cwd=workdir)
    assert run.returncode == 0, run.stderr
    assert "epoch 1/2" in run.stderr + run.stdout and "dev f1" in run.stderr + run.stdout
    # the last line: the score beside a baseline named as one, not `(always the majority class: ...)`, which read as
    # what this run had done (issue 32, 6)
    assert re.search(r"- done: \S+/mrpc/k16/seed222: test f1 [\d.]+, accuracy [\d.]+ \(majority-class baseline: f1 "
                     r"[\d.]+\), best dev epoch \d of 2, record \S+/result\.json$", (run.stderr + run.stdout).strip())
    [path] = records(workdir)
    assert path.relative_to(workdir) == Path(  # a local model's folder name: the last two parts of its real path
        f"results/runs/unipelt_apl,dev_size=20,model.name={workdir.name}_tiny-bert,train.epochs=2/mrpc/k16/seed222/result.json"
    )
    record = json.loads(path.read_text())
    for field in ("method", "task", "k", "seed", "status", "test", "dev_best", "best_epoch", "epochs_run",
                  "trainable_params", "train_seconds", "eval_seconds", "split", "config", "config_hash", "versions"):
        assert field in record, field
    assert (record["method"], record["task"], record["k"], record["seed"], record["status"]) == ("unipelt_apl", "mrpc", 16, 222, "ok")
    assert set(record["test"]) == {"f1", "accuracy", "main"} and record["test"]["main"] == record["test"]["f1"]
    permutation = np.random.default_rng(222).permutation(60).tolist()
    assert record["split"] == {"train_indices": permutation[:16], "dev_indices": permutation[16:36]}
    assert record["versions"]["torch"] and record["config"]["method"]["gated"] is True

    before = path.read_text()
    again = in_process("method=unipelt_apl", "task=mrpc", "seed=222", *common(workdir), cwd=workdir)
    assert again.returncode == 0 and "skip:" in again.stderr + again.stdout and "epoch 1/2" not in again.stderr + again.stdout
    assert path.read_text() == before

    other = in_process("method=unipelt_apl", "task=mrpc", "seed=222", "method.bottleneck=8", *common(workdir), cwd=workdir)
    assert other.returncode == 0, other.stderr
    assert len(records(workdir)) == 2 and path.read_text() == before
    assert any("bottleneck=8" in str(p) for p in records(workdir))


def _fails(result: subprocess.CompletedProcess, *fragments: str, status: int = 2) -> str:
    output = result.stderr + result.stdout
    assert result.returncode == status, output
    for fragment in fragments:
        assert fragment in output, output
    assert "Traceback" not in output, output
    return output


def test_bad_inputs_are_one_line_and_write_no_record(workdir, in_process):
    """What only the runner can find. The first through the real command; the rest in this process (each a process
    of its own cost 5-10 s of imports on 2 cores), which takes the same path from main() on."""
    from peltbench.data import load_split

    _fails(peltbench("method=adapter", "task=rte", *common(workdir), "k=50", cwd=workdir),
           "k=50 is too large: the train split has 60 rows and k + dev_size (50 + 20)")
    (workdir / "glue" / "RTE" / "dev.tsv").unlink()  # the files change below: in_process reads them afresh
    _fails(in_process("method=adapter", "task=rte", *common(workdir), cwd=workdir),
           f"data file not found: {workdir}/glue/RTE/dev.tsv")
    gpt = workdir / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    _fails(in_process("method=adapter", "task=cola", *common(workdir), "model.name=gpt", cwd=workdir),
           "model.name=gpt: its config says model_type 'gpt2'; peltbench supports bert (BERT), roberta (RoBERTa)")
    _fails(in_process("method=adapter", "task=cola", *common(workdir), "model.name=nowhere/", cwd=workdir),
           "could not load model 'nowhere/'")
    cola = workdir / "glue" / "CoLA" / "train.tsv"
    lines = cola.read_text().splitlines()
    lines[6] = lines[6].replace("\t", " ", 1)
    cola.write_text("\n".join(lines) + "\n")
    _fails(in_process("method=adapter", "task=cola", *common(workdir), cwd=workdir),
           f"malformed row in {cola}, line 7: expected 4 tab-separated fields, found 3")
    load_split.cache_clear()
    assert records(workdir) == []


BAD_INPUTS = [  # (arguments, the one line printed): Hydra's errors and peltbench's alike, each exit status 2
    (["method=adaptr", "task=rte"], "Could not find 'method/adaptr'; Available options in 'method': adalora, adapter,"),
    (["method=adapter", "task=wnli"], "Could not find 'task/wnli'; Available options in 'task': cola, mnli, mrpc, qnli,"),
    (["task=rte"], "method= is required: one of adalora, adapter, bitfit, "),
    (["method=lora"], "task= is required: one of cola, mnli"),
    (["method=lora", "task=rte", "k=["], "k=[: not a valid override"),
    (["method=lora", "task=rte", "k=-1"], "k=-1: must be a positive number of training examples"),
    (["method=lora", "task=rte", "seed=abc"], "seed=abc: must be a non-negative integer"),
    (["method=lora", "task=rte", "precision=fp16"], "precision=fp16: must be auto, bf16 or fp32"),
    (["method=lora", "task=rte", "device=gpu"], "device=gpu: must be auto, cpu, cuda, cuda:N or mps"),
    (["method=lora", "task=rte", "device=cpu", "precision=bf16"], "precision=bf16 is refused on a CPU: peltbench"),
    (["method=lora", "task=rte", "train.epochs=0"], "train.epochs=0: must be a positive integer"),
    (["method=lora", "task=rte", "method.lora_targets=[query,output]"], "method.lora_targets=[query,output]: must be"),
    (["method=lora", "task=rte", "train.epoch=3"], "train.epoch: no such setting"),
    (["method=lora", "task=rte", "+train.epoch=3"], "train.epoch: not a peltbench setting; train has batch_size,"),
    (["method=adapter", "task=rte", "+method.bottlenek=256"], "method.bottlenek: not a setting of method adapter"),
    (["method=lora", "task=rte", "k=100,500"], "Ambiguous value for argument 'k=100,500'"),
    (["method=lora", "task=rte", "logger=nope"], "Could not find 'logger/nope'"),
    (["method=lora", "task=rte", "logger=[csv,bogus]"],
     "Could not find 'logger/bogus'; Available options in 'logger': csv, mlflow, tensorboard, wandb"),
    (["method=lora", "task=rte", "k=0", "--cfg", "job"], "k=0: must be a positive number"),
    (["-m", "method=lora,adapter", "task=rte", "seed=111,-2"], "seed=-2: must be a non-negative integer"),
    (["-m", "method=lora,adaptr", "task=rte"], "Could not find 'method/adaptr'"),
    (["-m", "task=rte", "method.lr=1e-3"], "method.lr: a method setting needs method=NAME"),
    # the experiment sweeps method=adapter: a plain method.lr reaches each job (overrides.py) and is checked there
    (["-m", "+experiment=fig2_bottleneck", "method.lr=0"], "method.lr=0: must be a positive number"),
    (["+experiment=table1"], "this is a sweep (hydra.sweeper.params, e.g. from +experiment=...): run it with -m"),
    (["--run", "method=lora", "task=rte", "--cfg", "job"], "give only one of --run, --multirun (-m), --cfg and --info"),
    (["-m", "method=lora,adapter", "task=rte", "--info"], "give only one of --run, --multirun (-m), --cfg and --info"),
    (["-m", "method=lora,adapter", "task=rte", "--cfg", "hydra"], "-m with --cfg hydra: a sweep shows each run's config"),
]


@pytest.mark.parametrize("arguments,line", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_status_2_before_anything_runs(arguments, line, tmp_path, in_process):
    result = in_process(*arguments, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"peltbench: error: {line}"), result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no Hydra log folder, no record: nothing started


def test_bad_values_answer_before_torch_is_imported(tmp_path):
    """Issue 9: a bad value was reported 12-21 s in, after torch had loaded."""
    script = ("import sys; from peltbench.cli import main\n"
              "sys.argv = ['peltbench', 'method=lora', 'task=rte', 'k=-1']\n"
              "try:\n    main()\nexcept SystemExit as exit:\n"
              "    print(exit.code, sorted({'torch', 'transformers', 'datasets'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stdout == "2 []\n", result.stdout + result.stderr
    assert result.stderr == "peltbench: error: k=-1: must be a positive number of training examples (100, 500, 1000) or 'all'\n"


def test_exit_status_1_for_a_failed_run_2_for_bad_input_found_by_the_runner(monkeypatch, tmp_path, in_process):
    import peltbench.runner
    from peltbench import UserError
    from peltbench.runner import Outcome

    def outcome(status, error=None):
        return lambda cfgs, results_dir=None: [Outcome(status, {"status": status}, error) for _ in cfgs]

    write_glue(tmp_path / "glue")  # the command reads each task's data before the first run
    data = ("data.dir=glue", "k=16", "dev_size=20")
    monkeypatch.setattr(peltbench.runner, "run_group", outcome("failed", RuntimeError("CUDA out of memory")))
    assert in_process("method=lora", "task=rte", *data, cwd=tmp_path).returncode == 1
    assert in_process("-m", "method=lora", "task=rte,mrpc", *data, cwd=tmp_path).returncode == 1  # the sweep summary
    monkeypatch.setattr(peltbench.runner, "run_group", outcome("error", UserError("data file not found: glue/RTE/dev.tsv")))
    assert in_process("method=lora", "task=rte", *data, cwd=tmp_path).returncode == 2
    monkeypatch.setattr(peltbench.runner, "run_group", outcome("ok"))
    assert in_process("method=lora", "task=rte", *data, cwd=tmp_path).returncode == 0


def test_what_ctrl_c_became_on_its_way_is_the_interruption_not_bad_input(monkeypatch, tmp_path, in_process):
    """Ctrl-C inside transformers' loading can come back as `could not load model` (a UserError: status 2), in a
    sweep as another exception that Hydra's job catches as a failure and goes on: both are the interruption."""
    import peltbench.runner
    from peltbench import UserError, interrupts
    from peltbench.runner import Outcome

    def run_group(cfgs, results_dir=None):
        interrupts._received = True  # as the handler catch_ctrl_c installs does on SIGINT
        return [Outcome("error", error=UserError("could not load model 'bert-base-uncased': KeyboardInterrupt"))]

    write_glue(tmp_path / "glue")  # the command reads each task's data before the first run
    monkeypatch.setattr(interrupts, "_received", False)
    monkeypatch.setattr(peltbench.runner, "run_group", run_group)
    result = in_process("method=lora", "task=rte", "data.dir=glue", "k=16", "dev_size=20", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == ("peltbench: interrupted: the run did not finish and wrote no record; rerun the same "
                             "command to run it\n")

    def crashed(cfgs, results_dir=None):  # in a sweep, an exception in its place: Hydra's job catches it as failed
        interrupts._received = True
        raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")

    monkeypatch.setattr(peltbench.runner, "run_group", crashed)
    result = in_process("-m", "method=lora", "task=rte,cola", "data.dir=glue", "k=16", "dev_size=20", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == ("peltbench: interrupted: 0 of 2 runs done, 2 not done; rerun the same command to run "
                             "them (done runs are skipped)\n")


def test_no_arguments_prints_the_usage_with_status_2(tmp_path):
    result = peltbench(cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: peltbench method=METHOD task=TASK") and "--help" in result.stderr


def test_version(tmp_path):
    from importlib.metadata import version

    result = peltbench("--version", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, f"peltbench {version('peltbench')}\n")
    docs = (Path(__file__).parents[1] / "docs" / "command-line.md").read_text()
    assert f"| `peltbench --version` | `peltbench {version('peltbench')}`" in docs  # issue 21, 3o: it said 0.1.0


def test_info_needs_no_method_or_task(tmp_path):
    result = peltbench("--info", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "PeltbenchSlurmLauncher" in result.stdout and "logger/csv" in result.stdout


def test_cfg_job_prints_the_config_and_runs_nothing(tmp_path):
    result = peltbench("method=lora", "task=rte", "logger=[csv,tensorboard]", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "lora_rank: 8" in result.stdout and "tensorboard:" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_with_cfg_job_prints_every_run_s_config_and_runs_nothing(tmp_path):
    """Issue 21, 3o: `-m ... --cfg job` was refused; it shows each run's config, as `--cfg job` shows one run's."""
    result = peltbench("-m", "method=lora,adapter", "task=rte", "k=100,500", "--cfg", "job", "-p", "method", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    headers = [line for line in result.stdout.splitlines() if line.startswith("# run ")]
    assert headers == ["# run 1 of 4: method=lora task=rte k=100", "# run 2 of 4: method=lora task=rte k=500",
                       "# run 3 of 4: method=adapter task=rte k=100", "# run 4 of 4: method=adapter task=rte k=500"]
    assert result.stdout.count("lora_rank: 8") == 2 and result.stdout.count("bottleneck: 48") == 2
    assert "k: 100" not in result.stdout  # -p method: only the method's node
    assert list(tmp_path.iterdir()) == []


def test_help_lists_every_setting(tmp_path):
    from conftest import compose_config
    from peltbench.config import METHOD_SETTINGS, _leaves, method_settings
    from peltbench.packaged import options

    result = peltbench("--help", cwd=tmp_path)
    assert result.returncode == 0
    text = result.stdout
    assert "unipelt_apl_nogate" in text and "qqp" in text and "+experiment=" in text and "table1_prefix_l50" in text
    assert "logger=         csv mlflow tensorboard wandb" in text and "hydra/launcher=slurm" in text
    defaults = compose_config("method=lora", "task=rte")
    for key in _leaves(defaults, skip=("hydra", "method", "task", "logger")):
        assert f"  {key}=" in text, key
    for key in [*METHOD_SETTINGS, *method_settings()]:
        assert key == "name" or f"  method.{key} " in text, key
    for logger in options("logger"):
        for key in _leaves(compose_config("method=lora", "task=rte", f"logger={logger}").logger):
            assert f"  logger.{key}=" in text, key
    assert "Exit status: 0 done" in text


def test_ctrl_c_ends_a_run_with_one_line_and_status_130_and_no_record(workdir, in_process):
    """Issue 26, 5: Ctrl-C printed a traceback and exited 1; the interrupted run leaves nothing that blocks its rerun.
    Issue 47: it stops at the end of the training step, with a checkpoint the rerun goes on from."""
    from test_sweep import interrupt, training

    arguments = ["method=adapter", "task=rte", *common(workdir), "train.epochs=20", "results_dir=results"]
    status, out, err = interrupt(workdir, arguments, lambda: training(workdir))
    assert status == 130, out + err
    assert re.fullmatch(r"peltbench: interrupted: the run did not finish; its checkpoint is written, at epoch \d+ of 20"
                        r"( \(\+\d+ steps?\))?: rerun the same command to go on from it\n", err), err
    assert "Traceback" not in out
    # no record and no claim; its checkpoint, and its metrics.csv so far, which the rerun goes on in
    [folder] = [path.parent for path in (workdir / "results").rglob("checkpoint.pt")]
    assert sorted(path.name for path in folder.iterdir()) == [".lock", "checkpoint.pt", "metrics.csv"]
    rerun = in_process(*arguments, cwd=workdir)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "from its checkpoint at epoch " in rerun.stdout + rerun.stderr
    [record] = records(workdir)
    assert json.loads(record.read_text())["status"] == "ok" and not (folder / "checkpoint.pt").exists()


def test_missing_task_data_is_one_line_before_the_sweep_starts(tmp_path):
    """Issue 26, 5: `task=rte,mrpc` with the shipped data/glue (no MRPC) found out when MRPC's runs came up, and
    the summary's "rerun the same command" failed again. Now nothing starts, and torch is not loaded."""
    shipped = tmp_path / "glue"
    write_glue(shipped)
    shutil.rmtree(shipped / "MRPC")
    script = ("import sys; from peltbench.cli import main\n"
              "sys.argv = ['peltbench', *sys.argv[1:]]\n"
              "try:\n    main()\nexcept SystemExit as exit:\n"
              "    print(exit.code, sorted({'torch', 'transformers', 'datasets'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script, "-m", "method=adapter,lora", "task=rte,mrpc",
                             "data.dir=glue", "k=16", "dev_size=20"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout == "2 []\n", result.stdout + result.stderr
    assert result.stderr == (
        f"peltbench: error: task=mrpc: no mrpc data under {shipped} (data.dir): expected {shipped}/MRPC/train.tsv or "
        f"{shipped}/mrpc/train-*.parquet; or leave data.dir unset: task mrpc reads nyu-mll/glue/mrpc with datasets "
        f"(README: Offline use)\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["glue"]  # no log folder, no results: nothing started
    (shipped / "RTE" / "dev.tsv").unlink()
    result = peltbench("-m", "method=adapter", "task=rte,cola", "data.dir=glue", "k=16", "dev_size=20", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"peltbench: error: task=rte: data file not found: {shipped}/RTE/dev.tsv (under data.dir)\n"
