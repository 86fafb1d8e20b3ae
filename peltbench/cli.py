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

from . import UserError
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
    from .runner import run_experiment  # imported here so config errors answer before torch loads

    sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        record = run_experiment(cfg, Path(to_absolute_path(cfg.results_dir)))
    except UserError as error:
        if sweep:  # logged, and the sweep goes on; its summary lists the run as not run
            log.error("%s", error)
            return "error"
        print(f"peltbench: error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception:
        if sweep:  # the runner logged it (and wrote a `failed` record); the sweep goes on, its summary lists it
            return "failed"
        raise
    return record["status"]


def main() -> None:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(HELP.format(methods=" ".join(options("method")), tasks=" ".join(options("task"))))
        return
    register_slurm_launcher()
    _run()


def register_slurm_launcher() -> None:
    """Make `hydra/launcher=slurm` available (when the `slurm` extra is installed).

    Importing the plugin registers its config; registering its class by hand is needed because an editable
    install (setuptools >= 64) hides `hydra_plugins.peltbench_slurm` from Hydra's plugin scan (hydra#2359).
    """
    try:
        from hydra_plugins.peltbench_slurm import PeltbenchSlurmLauncher
    except ImportError:  # hydra-submitit-launcher is not installed
        return
    from hydra.core.plugins import Plugins

    Plugins.instance().register(PeltbenchSlurmLauncher)


if __name__ == "__main__":
    main()
