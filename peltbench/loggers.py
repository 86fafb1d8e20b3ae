"""Per-run metric loggers, chosen with `logger=` (conf/logger/): csv (the default), tensorboard, mlflow, wandb.

The training loop opens one RunLogger per run (in fused training, one per member run) and tells it each epoch:

    with open_logger(cfg, run_dir, run_name) as logger:       # run_dir: the folder of the run's result.json
        logger.log_epoch(epoch, {"train_loss": ..., "dev_accuracy": ..., "lr": ..., "epoch_seconds": ...,
                                 "gate_adapter": ...})
        logger.log_test({"test_accuracy": ...})
    # leaving the `with` closes it; an exception closes it as failed (MLflow and W&B mark the run so)

A None metric is left out (an empty cell in CSV). Each logger imports its library when it is opened, so importing
this module costs nothing; a missing library is reported when the config is checked (config.check_logger).
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .config import check_logger

Metrics = dict[str, "float | None"]


class RunLogger:
    """One run's loggers (none with logger=[], several with logger=[csv,tensorboard]), each told the same."""

    def __init__(self, backends: list) -> None:
        self.backends = backends
        self.last_epoch = 0
        self.closed = False

    def log_epoch(self, epoch: int, metrics: Metrics) -> None:
        self.last_epoch = epoch
        values = _present(metrics)
        for backend in self.backends:
            backend.log_epoch(epoch, values)

    def log_test(self, metrics: Metrics) -> None:
        values = _present(metrics)
        for backend in self.backends:
            backend.log_test(self.last_epoch, values)

    def close(self, failed: bool = False) -> None:
        if not self.closed:
            self.closed = True
            for backend in self.backends:
                backend.close(failed)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.close(failed=error is not None)


def open_logger(cfg: DictConfig, run_dir: Path, run_name: str) -> RunLogger:
    """The loggers `cfg.logger` chooses, opened for the run whose record lives in `run_dir`.

    run_name names the run where several share one place (a TensorBoard folder, an MLflow experiment, a W&B
    project), e.g. `adapter,bottleneck=256/rte/k100/seed111`.
    """
    chosen = cfg.get("logger")
    check_logger(chosen)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunLogger([BACKENDS[name](settings, cfg, run_dir, run_name) for name, settings in (chosen or {}).items()])


def _present(metrics: Metrics) -> dict[str, float]:
    return {key: float(value) for key, value in metrics.items() if value is not None}


def run_params(cfg: DictConfig) -> dict[str, object]:
    """The run's settings as flat `key: value` pairs (method.lr, train.epochs, task, ...), for MLflow and W&B."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    for key in ("hydra", "logger"):
        settings.pop(key, None)
    settings["task"] = settings["task"]["name"]  # the rest is where the task's files are
    flat: dict[str, object] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value
    walk(settings, "")
    return flat


class CsvLogger:
    """`metrics.csv` beside result.json: a row per epoch, then the test row (empty epoch). Rewritten whole at
    each call (a few dozen rows), so a column first seen late gets a header and a reader never sees half a row."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str) -> None:
        self.path = run_dir / "metrics.csv"
        self.rows: list[dict[str, object]] = []

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.rows.append({"epoch": epoch, **metrics})
        self._write()

    def log_test(self, last_epoch: int, metrics: dict[str, float]) -> None:
        self.rows.append({"epoch": "", **metrics})
        self._write()

    def close(self, failed: bool) -> None:
        pass  # every call already wrote the whole file

    def _write(self) -> None:
        columns = list(dict.fromkeys(key for row in self.rows for key in row))
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(temporary, self.path)


class TensorBoardLogger:
    """Scalars per epoch (step = epoch) and the test metrics at the last epoch; the run's config as text."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = run_dir / "tensorboard" if settings.save_dir is None else Path(settings.save_dir).expanduser() / run_name
        for stale in folder.glob("events.out.tfevents.*"):  # a rerun of a failed run replaces its curves
            stale.unlink()
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("config", "    " + OmegaConf.to_yaml(_without_hydra(cfg)).replace("\n", "\n    "))

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, epoch)
        self.writer.flush()

    def log_test(self, last_epoch: int, metrics: dict[str, float]) -> None:
        self.log_epoch(last_epoch, metrics)

    def close(self, failed: bool) -> None:
        self.writer.close()


class MlflowLogger:
    """One MLflow run per peltbench run, through MlflowClient (not the global `mlflow.start_run`), so that the runs
    of a fused sweep log side by side. The run's settings are its params; metrics have step = epoch."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str) -> None:
        # MLflow 3 refuses its file store unless told it is wanted; the file store is what needs no server.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient(tracking_uri=_tracking_uri(str(settings.tracking_uri)))
        experiment = self._experiment(str(settings.experiment_name))
        run = self.client.create_run(experiment, run_name=run_name, tags={"peltbench.run_dir": str(run_dir.absolute())})
        self.run_id = run.info.run_id
        params = [Param(key, str(value)) for key, value in run_params(cfg).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per call
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another process created it just now
            return self.client.get_experiment_by_name(name).experiment_id

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, epoch) for key, value in metrics.items()])

    def log_test(self, last_epoch: int, metrics: dict[str, float]) -> None:
        self.log_epoch(last_epoch, metrics)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _tracking_uri(uri: str) -> str:
    """A URI as given (http://..., sqlite:///..., file:///...); a plain folder as an absolute file:// URI."""
    return uri if "://" in uri or uri.startswith("file:") else Path(uri).expanduser().absolute().as_uri()


class WandbLogger:
    """One W&B run per peltbench run (several may be open at once), its files under <run folder>/wandb; metrics
    per epoch with step = epoch, the test metrics in the run's summary."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str) -> None:
        import wandb

        self.run = wandb.init(
            project=settings.project, entity=settings.entity, group=settings.group, tags=list(settings.tags),
            mode=settings.mode, name=run_name, dir=str(run_dir), config=run_params(cfg), reinit="create_new",
            settings=wandb.Settings(console="off", quiet=True),  # peltbench's own log says what happens
        )

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=epoch)

    def log_test(self, last_epoch: int, metrics: dict[str, float]) -> None:
        self.run.summary.update(metrics)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _without_hydra(cfg: DictConfig) -> dict:
    settings = OmegaConf.to_container(cfg, resolve=True)
    settings.pop("hydra", None)
    return settings


BACKENDS = {"csv": CsvLogger, "tensorboard": TensorBoardLogger, "mlflow": MlflowLogger, "wandb": WandbLogger}
