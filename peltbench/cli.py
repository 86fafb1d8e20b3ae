"""`peltbench`: one experiment per Hydra job, e.g. `peltbench method=unipelt_apl task=cola k=100 seed=111`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from .packaged import options

log = logging.getLogger("peltbench")

HELP = """\
usage: peltbench method=METHOD task=TASK [k=100] [seed=111] [KEY=VALUE ...]
       peltbench -m method=adapter,lora task=rte,mrpc k=100 seed=111,222     (a sweep)
       peltbench -m ... hydra/launcher=slurm [hydra.launcher.partition=gpu ...]  (the sweep as a SLURM job array)

Runs one few-shot GLUE experiment (or, with -m, a grid of them) and writes one result record
per run under results_dir (default results/runs). An identical finished run is skipped.

methods: {methods}
tasks:   {tasks}

common settings (Hydra overrides):
  k=100|500|1000|all     training examples (the rest of the protocol: METHODS.md)
  seed=111               data seed (111 222 333 444 555 in the paper)
  model.name=DIR         a Hub id or a local BERT checkpoint (default bert-base-uncased)
  data.dir=DIR           a local GLUE directory instead of the Hub (glue_data TSV or parquet layout)
  method.KEY=VALUE       a method setting, e.g. method.bottleneck=256, method.lora_scale=4, method.gated=true
  train.epochs=50 train.patience=10 device=auto precision=auto results_dir=results/runs

Show a composed config without running it: peltbench method=lora task=rte --cfg job
A sweep is resumed by running it again (finished runs are skipped). What it still lacks, and the command
that runs only that: peltbench-missing method=adapter,lora task=rte,mrpc k=100 seed=111,222
Hydra's own options: peltbench --hydra-help
"""


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _run(cfg: DictConfig) -> str:
    from .runner import run_group, sweep_status  # imported here so config errors answer before torch loads

    [outcome] = run_group([cfg], Path(to_absolute_path(cfg.results_dir)))
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # the sweep goes on; its summary lists what is not done
        return sweep_status(outcome)
    if outcome.status == "error":
        print(f"peltbench: error: {outcome.error}", file=sys.stderr)
        sys.exit(2)
    if outcome.status == "failed":  # the runner logged why, and wrote a `failed` record a rerun retries
        sys.exit(1)
    return outcome.status


def main() -> None:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(HELP.format(methods=" ".join(options("method")), tasks=" ".join(options("task"))))
        return
    _run()


if __name__ == "__main__":
    main()
