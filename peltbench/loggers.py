"""Per-run metric loggers, chosen with `logger=` (conf/logger/): csv (the default), tensorboard, mlflow, wandb.

The training loop opens one RunLogger per run (in fused training, one per member run) and tells it each epoch:

    with open_logger(cfg, run_dir, run_name) as logger:       # run_dir: the folder of the run's result.json
        logger.log_epoch(epoch, {"train_loss": ..., "dev_accuracy": ..., "lr": ..., "epoch_seconds": ...,
                                 "gate_adapter": ...})
        logger.log_test({"test_accuracy": ..., "dev_best_accuracy": ..., "best_epoch": 7}, epoch=7)
    # leaving the `with` closes it; an exception closes it as failed (MLflow and W&B mark the run so); a run stopped
    # by Ctrl-C or SIGTERM, which writes no record, removes what its loggers wrote beside it (logger.discard()),
    # unless a checkpoint goes on from it: then `logger.state()` is in the checkpoint, and
    # open_logger(..., resume=state) goes on where it was (metrics.csv cut back to it, TensorBoard's later steps
    # purged, the same MLflow or W&B run)

A None metric is left out (an empty cell in CSV). Each logger imports its library when it is opened, so importing
this module costs nothing. A logger fails before the model loads, or not at all: a missing library is reported when
the config is checked (config.check_logger), a service it cannot reach at start-up (`check_can_start`: W&B without an
API key and not offline, an MLflow tracking URI the installed mlflow cannot open or whose server does not answer);
a logger that fails later is dropped with a warning and the run goes on (its record and metrics.csv are its own).
"""

from __future__ import annotations

import csv
import logging
import os
import tempfile
import time
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from omegaconf import DictConfig, OmegaConf

from . import UserError
from .config import check_logger

log = logging.getLogger("peltbench")

Metrics = dict[str, "float | None"]


class RunLogger:
    """One run's loggers (none with logger=[], several with logger=[csv,tensorboard]), each told the same. A logger
    that fails is dropped with a warning: the run goes on."""

    def __init__(self, backends: dict[str, object], run_name: str = "") -> None:
        self.backends = dict(backends)
        self.run_name = run_name
        self.last_epoch = 0
        self.closed = False

    def log_epoch(self, epoch: int, metrics: Metrics) -> None:
        self.last_epoch = epoch
        values = _present(metrics)
        for name, backend in list(self.backends.items()):
            self._call(name, backend.log_epoch, epoch, values)

    def log_test(self, metrics: Metrics, epoch: int | None = None) -> None:
        """The run's result: its test metrics, scored with the state of the best dev epoch (`epoch`, the step they
        are logged at; the last epoch logged when None), and that epoch's dev metrics."""
        values = _present(metrics)
        for name, backend in list(self.backends.items()):
            self._call(name, backend.log_test, self.last_epoch if epoch is None else epoch, values)

    def close(self, failed: bool = False) -> None:
        if not self.closed:
            self.closed = True
            for name, backend in list(self.backends.items()):
                self._call(name, backend.close, failed)

    def state(self) -> dict:
        """What a checkpoint keeps of the loggers: the last step logged and each logger's own (open_logger(resume=))."""
        return {"last_epoch": self.last_epoch,
                "backends": {name: backend.state() for name, backend in self.backends.items() if hasattr(backend, "state")}}

    def discard(self) -> None:
        """The run was stopped (Ctrl-C, SIGTERM) and writes no record: remove what the loggers wrote beside it (a
        partial metrics.csv would pass for a run's), closing them first. A service's run (MLflow, W&B) stays, marked
        failed."""
        self.close(failed=True)
        for name, backend in list(self.backends.items()):
            if hasattr(backend, "discard"):
                self._call(name, backend.discard)

    def _call(self, name: str, method, *args) -> None:
        try:
            method(*args)
        except Exception as error:  # the logger's library or service: not a reason to lose the run
            del self.backends[name]
            log.warning("logger %s failed for %s and is dropped; the run goes on: %s", name, self.run_name,
                        _first_line(error))

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.close(failed=error is not None)


def open_logger(cfg: DictConfig, run_dir: Path, run_name: str, resume: dict | None = None) -> RunLogger:
    """The loggers `cfg.logger` chooses, opened for the run whose record lives in `run_dir` (one that cannot open is
    left out with a warning); `resume`: a RunLogger.state() from a checkpoint, where they go on from.

    run_name names the run where several share one place (a TensorBoard folder, an MLflow experiment, a W&B
    project), e.g. `adapter,bottleneck=256/rte/k100/seed111`.
    """
    chosen = cfg.get("logger")
    check_logger(chosen)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    backends = {}
    for name, settings in (chosen or {}).items():
        try:
            if resume is None:
                backends[name] = BACKENDS[name](settings, cfg, run_dir, run_name)
            else:
                backends[name] = BACKENDS[name](settings, cfg, run_dir, run_name,
                                                resume={"last_epoch": resume["last_epoch"],
                                                        **resume["backends"].get(name, {})})
        except Exception as error:  # e.g. a server that stopped answering since start-up
            log.warning("logger %s could not start for %s and is left out; the run goes on: %s", name, run_name,
                        _first_line(error))
    logger = RunLogger(backends, run_name)
    logger.last_epoch = resume["last_epoch"] if resume else 0
    return logger


def check_can_start(logger: DictConfig | None) -> None:
    """A UserError (one line) if a chosen logger cannot start here: W&B online without an API key, an MLflow
    tracking URI that the installed mlflow cannot open (a database with mlflow-skinny) or whose server does not
    answer. Run at start-up, before any model loads (peltbench's preflight; each run that will train)."""
    for name, settings in (logger or {}).items():
        if name == "wandb":
            _check_wandb(settings)
        elif name == "mlflow":
            _check_mlflow(str(settings.tracking_uri))


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


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


def step_unit(cfg: DictConfig) -> str:
    """What the loggers' step counts: `epoch`, or `step` (optimiser steps) when dev is evaluated every
    `train.eval_every` steps (LM-BFF): then each evaluation is logged at its step and the result at the best one."""
    train = cfg.get("train") or {}
    return "step" if train.get("eval_every") else "epoch"


class CsvLogger:
    """`metrics.csv` beside result.json: a row per epoch; the result (`test_*`, scored with the best dev epoch's state,
    `dev_best_*` and `best_epoch`) joins the best epoch's row, the step the other loggers log it at, so `epoch` stays
    an integer column.
    Rewritten whole at each call (a few dozen rows), so a column first seen late gets a header and a reader never
    sees half a row."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str,
                 resume: dict | None = None) -> None:
        self.path = run_dir / "metrics.csv"
        self.rows: list[dict[str, object]] = [dict(row) for row in (resume or {}).get("rows", [])]
        self.unit = step_unit(cfg)  # the first column: `epoch`, or `step` when dev is evaluated every N steps
        if resume is not None:  # rows logged after the checkpoint (a job killed later) go
            self._write()

    def state(self) -> dict:
        return {"rows": [dict(row) for row in self.rows]}

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.rows.append({self.unit: epoch, **metrics})
        self._write()

    def log_test(self, epoch: int, metrics: dict[str, float]) -> None:
        row = next((row for row in self.rows if row[self.unit] == epoch), None)
        if row is None:
            row = {self.unit: epoch}
            self.rows.append(row)
        row.update(metrics)
        self._write()

    def close(self, failed: bool) -> None:
        pass  # every call already wrote the whole file

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        columns = list(dict.fromkeys(key for row in self.rows for key in row))
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(temporary, self.path)


class TensorBoardLogger:
    """Scalars per epoch (step = epoch) and the result at the best epoch; the run's config as text."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str,
                 resume: dict | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = run_dir / "tensorboard" if settings.save_dir is None else Path(settings.save_dir).expanduser() / run_name
        self.folder = folder
        if resume is not None:  # the same curves, what was logged after the checkpoint hidden (TensorBoard's purge)
            self.writer = SummaryWriter(log_dir=str(folder), purge_step=int(resume["last_epoch"]) + 1)
            return
        for stale in folder.glob("events.out.tfevents.*"):  # a rerun of a failed run replaces its curves
            stale.unlink()
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("config", "    " + OmegaConf.to_yaml(_without_hydra(cfg)).replace("\n", "\n    "))

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, epoch)
        self.writer.flush()

    def log_test(self, epoch: int, metrics: dict[str, float]) -> None:
        self.log_epoch(epoch, metrics)

    def close(self, failed: bool) -> None:
        self.writer.close()

    def discard(self) -> None:
        for events in self.folder.glob("events.out.tfevents.*"):
            events.unlink()
        try:
            self.folder.rmdir()  # made for this run, now empty
        except OSError:
            pass


class MlflowLogger:
    """One MLflow run per peltbench run, through MlflowClient (not the global `mlflow.start_run`), so that the runs
    of a fused sweep log side by side. The run's settings are its params; metrics have step = epoch (the result: the
    best epoch); at the end the run's record and metrics.csv are its artifacts."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str,
                 resume: dict | None = None) -> None:
        # MLflow 3 refuses its file store unless told it is wanted; the file store is what needs no server.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient(tracking_uri=_tracking_uri(str(settings.tracking_uri)))
        self.run_dir = run_dir
        if resume is not None and resume.get("run_id"):  # the same MLflow run, running again (steps after the
            self.run_id = resume["run_id"]               # checkpoint are logged again, with the same values)
            self.client.update_run(self.run_id, status="RUNNING")
            return
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

    def state(self) -> dict:
        return {"run_id": self.run_id}

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, epoch) for key, value in metrics.items()])

    def log_test(self, epoch: int, metrics: dict[str, float]) -> None:
        self.log_epoch(epoch, metrics)

    def close(self, failed: bool) -> None:
        try:
            for name in ("result.json", "metrics.csv"):  # written by now: the group closes its loggers last
                if (self.run_dir / name).is_file():
                    self.client.log_artifact(self.run_id, str(self.run_dir / name))
        finally:
            self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _tracking_uri(uri: str) -> str:
    """A URI as given (http://..., sqlite:///..., file:///...); a plain folder as an absolute file:// URI."""
    return uri if "://" in uri or uri.startswith("file:") else Path(uri).expanduser().absolute().as_uri()


class WandbLogger:
    """One W&B run per peltbench run (several may be open at once), its files under <run folder>/wandb; metrics
    per epoch with step = epoch, the test metrics in the run's summary."""

    def __init__(self, settings: DictConfig, cfg: DictConfig, run_dir: Path, run_name: str,
                 resume: dict | None = None) -> None:
        import wandb

        again = {"id": resume["run_id"], "resume": "allow"} if resume and resume.get("run_id") else {}
        self.run = wandb.init(
            project=settings.project, entity=settings.entity, group=settings.group, tags=list(settings.tags),
            mode=settings.mode, name=run_name, dir=str(run_dir), config=run_params(cfg), reinit="create_new",
            settings=wandb.Settings(console="off", quiet=True),  # peltbench's own log says what happens
            **again,  # a checkpoint's run goes on (W&B ignores steps it has: those after the checkpoint)
        )

    def state(self) -> dict:
        return {"run_id": self.run.id}

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=epoch)

    def log_test(self, epoch: int, metrics: dict[str, float]) -> None:
        self.run.summary.update(metrics)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _check_wandb(settings: DictConfig) -> None:
    """W&B online needs an API key, found where wandb.init looks (WANDB_API_KEY, an identity token file, ~/.netrc
    for the W&B host, its settings files); offline and disabled need none. Read without starting wandb's service."""
    import wandb
    from wandb.sdk.lib.wbauth import read_netrc_auth

    resolved = wandb.Settings(quiet=True)
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR", "~/.config/wandb")).expanduser()
    resolved.settings_system = str(config_dir / "settings")  # as wandb.setup() does
    resolved.update_from_system_settings()
    resolved.update_from_env_vars(dict(os.environ))
    mode = settings.mode or resolved.mode
    if mode in ("offline", "dryrun", "disabled"):
        return
    if resolved.api_key or os.environ.get("WANDB_IDENTITY_TOKEN_FILE") or read_netrc_auth(host=resolved.base_url):
        return
    raise UserError(f"logger=wandb: no W&B API key for {resolved.base_url} (WANDB_API_KEY, or `wandb login`), and not "
                    f"offline: log in, or log offline with logger.wandb.mode=offline (or WANDB_MODE=offline) and "
                    f"`wandb sync` later")


@lru_cache(maxsize=None)
def _check_mlflow(uri: str) -> None:
    """The installed mlflow opens the tracking URI (mlflow-skinny has no database stores: SQLAlchemy comes with the
    full `mlflow` package), and a server URL answers. A folder (the file store) needs nothing. Once per URI and
    process (a sweep checks each of its runs)."""
    resolved = _tracking_uri(uri)
    scheme = urlsplit(resolved).scheme
    if scheme == "file":
        _check_store_folder(uri, Path(url2pathname(urlsplit(resolved).path)))
        return
    folder = "or log to a folder (the file store, e.g. mlruns)"
    if scheme.partition("+")[0] in DATABASES and find_spec("sqlalchemy") is None:
        raise UserError(f"logger.mlflow.tracking_uri={uri}: a database store needs the full mlflow package (pip "
                        f"install mlflow; mlflow-skinny has none), {folder}")
    from mlflow import MlflowClient

    try:
        getattr(MlflowClient(tracking_uri=resolved), "_tracking_client").store  # built as the first call would
    except Exception as error:
        reason = _first_line(error).split(". ")[0]
        raise UserError(f"logger.mlflow.tracking_uri={uri}: the installed mlflow cannot open it ({reason}), "
                        f"{folder}") from None
    if scheme in ("http", "https"):
        problem = _unanswered(resolved)
        if problem:
            raise UserError(f"logger.mlflow.tracking_uri={uri}: no MLflow server answers there ({problem}): start "
                            f"it (mlflow server), {folder}")


def _check_store_folder(uri: str, folder: Path) -> None:
    """MLflow's file store can make its folders at `folder`: it is a folder, or can be made one, where we may write
    (not a regular file, not under one, not in /proc or /sys). Probed with a folder made and removed at once, as
    root may write where the permission bits say no and a pseudo file system refuses what access() allows."""
    existing = next(path for path in [folder, *folder.parents] if path.exists())
    problem = None
    if not existing.is_dir():
        problem = f"{existing} is a file, not a folder"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".peltbench-probe.", dir=existing))
        except OSError as error:
            problem = f"cannot make MLflow's folders in {existing} ({error.strerror})"
    if problem:
        raise UserError(f"logger.mlflow.tracking_uri={uri}: {problem}: give a folder MLflow may write (its file "
                        f"store), a server URL or a database")


DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy stores (a driver may follow: mysql+pymysql)


def _unanswered(url: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at `url` (its /health), or None when something does (any HTTP status: a proxy or a login
    page is the server's business). mlflow itself would retry for about 4 minutes before failing."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return str(getattr(reason, "strerror", None) or reason)
    return None


def _without_hydra(cfg: DictConfig) -> dict:
    settings = OmegaConf.to_container(cfg, resolve=True)
    settings.pop("hydra", None)
    return settings


BACKENDS = {"csv": CsvLogger, "tensorboard": TensorBoardLogger, "mlflow": MlflowLogger, "wandb": WandbLogger}
