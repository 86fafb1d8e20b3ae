"""What a sweep still lacks: `peltbench-missing`, and the summary printed at the end of `peltbench -m ...`.

    peltbench-missing method=adapter,lora task=rte,sst2 k=100 seed=111,222
    peltbench-missing +experiment=table1 hydra/launcher=slurm hydra.launcher.partition=gpu

takes a sweep's arguments, expands its grid as Hydra's BasicSweeper does (the `hydra.sweeper.params` of an
`+experiment` file, then the command line's key=a,b,c), composes each run's config, and looks at its record:
done (status ok), failed, missing (no readable record), running (claimed by another live process, which is
training it: peltbench.claim), unreadable (a record we may not read, e.g. another user's), another config's
record (a rerun stops on it), or damaged (record.damage, the one validation every reader of records applies: a field
missing or of the wrong type, or a record whose fields, config, identity and hash disagree; a rerun stops on it too).
It prints the counts, the runs not done with their reasons, and the `peltbench -m ...` command(s) that run only the
failed and missing ones; other arguments (hydra/launcher=slurm, results_dir=...) go through to those commands.
Exit status: 0 when every run is done, 1 otherwise, 2 for a bad argument.

The sweep's own summary also knows why a run of this sweep left no record (a config error, a record that could
not be written, a SLURM job that ended without results), and which runs it skipped because another process was
training them: each job that ends so writes `outcome.json` into its log folder, and the summary reads it. A run its
launcher gave no job (done or damaged when the sweep began; on SLURM, another process's) has no log folder: the
launcher tells the summary (note_no_job), which takes it as it was unless its record changed since.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import logging
import os
import re
import shlex
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from . import UserError
from .checkpoint import progress_of
from .claim import describe, live_claim
from .config import check_config, planned_work
from .interrupts import stopped_by
from .overrides import as_given, pin_group_settings
from .packaged import use_searchpath
from .progress import progress
from .record import (Plain, against_run, omegaconf_strings, one_pass, read_record, record_folder, select,
                     unsaved)

log = logging.getLogger("peltbench")

USAGE = """\
usage: peltbench-missing [-m] SWEEP_ARGUMENTS...   e.g. peltbench-missing method=adapter,lora task=rte k=100 seed=111,222

Lists the runs of a sweep that are not done (no record, a failed one, or another config's record) and prints
the `peltbench -m ...` command(s) that run only the failed and missing ones. Give it the sweep's own arguments;
extra ones (hydra/launcher=slurm, hydra.launcher.partition=gpu, results_dir=DIR) go through to the commands.
Exit status: 0 when every run is done, 1 otherwise.
"""
CHECK_BAR_DELAY_S = 3.0  # a terminal shows a bar while a sweep's runs are checked once that has taken this long
STATES = ("done", "failed", "missing", "running", "unreadable", "foreign", "damaged")
OUTCOME_NAME = "outcome.json"  # in a job's log folder: why the run left no record, or that another process had it
RUNNING_ELSEWHERE = "another process was training it when this sweep reached it"


@dataclass(slots=True)  # 100,000 of them in a sweep's plan: no __dict__ each
class Run:
    """One run of a sweep: its job number, its swept key=value pairs, and the state of its record."""

    num: int
    values: dict[str, str]          # swept key -> value, e.g. {"method": "lora", "seed": "111"}
    label: str                      # its record folder under results_dir, e.g. lora/rte/k100/seed111
    path: Path
    state: str                      # one of STATES
    error: str | None = None        # why it is not done: a failed record's error line, the claim's holder, ...
    log_dir: Path | None = None     # the run's Hydra job folder in this sweep
    elsewhere: bool = False         # this sweep skipped it: another process was training it (outcome.json, or the plan)
    skipped: bool = False           # this sweep skipped it: done when its job came (outcome.json) or the sweep began


@dataclass
class Sweep:
    runs: list[Run]
    swept_keys: list[str]           # keys with a value per run (sweeper params and key=a,b,... arguments), in grid order
    passthrough: list[str] = field(default_factory=list)  # the other arguments, as given

    def count(self, state: str) -> int:
        return sum(run.state == state for run in self.runs)

    def not_done(self) -> list[Run]:
        return [run for run in self.runs if run.state != "done"]


def expand(config_loader: Any, sweep_config: DictConfig) -> tuple[list[list[str]], list[str]]:
    """The sweep's jobs (each a list of key=value overrides) in Hydra's order, and the keys that are swept."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    params = [f"{key}={value}" for key, value in (sweep_config.hydra.sweeper.params or {}).items()]
    arguments = list(sweep_config.hydra.overrides.task)
    parser = OverridesParser.create(config_loader=config_loader)
    overrides = parser.parse_overrides(params + arguments)
    swept = [o.get_key_element() for o in overrides[:len(params)]]
    swept += [o.get_key_element() for o in overrides[len(params):] if o.is_sweep_override()]
    [jobs] = BasicSweeper.split_arguments(overrides, None)
    keys = [o.split("=", 1)[0] for o in jobs[0]] if jobs else []
    return jobs, [key for key in keys if key in swept]


def check_sweep(config_loader: Any, sweep_config: DictConfig, arguments: list[str] | None = None,
                known: dict[int, NoJob] | None = None, logs: bool = True) -> Sweep:
    """Compose every run of the sweep whose (multirun) config is `sweep_config` and classify its record; `known`: the
    runs it gave no job (note_no_job), taken as they were where their record has not changed since; `logs`: with each
    run's job folder in this sweep (the sweep's summary reads them; peltbench-missing does not)."""
    jobs, swept_keys = expand(config_loader, sweep_config)
    runs = check_jobs(config_loader, sweep_config, jobs, swept_keys, known=known, logs=logs)
    passthrough = [] if arguments is None else _passthrough(arguments, swept_keys)
    return Sweep(runs, swept_keys, passthrough)


def check_jobs(config_loader: Any, sweep_config: DictConfig, jobs: Sequence[Sequence[str]],
               swept_keys: Sequence[str] = (), first_num: int = 0, known: dict[int, NoJob] | None = None,
               logs: bool = True) -> list[Run]:
    """The state of each job's record (jobs as Hydra's sweeper hands them to a launcher); `known`: runs given no job
    (note_no_job), each taken as it was, without composing it again, where its record has not changed since; `logs`:
    with each run's job folder."""
    compose = _Composer(config_loader, sweep_config)
    runs = []
    with one_pass():
        for num, job in enumerate(progress(jobs, "checking runs", unit="run", delay=CHECK_BAR_DELAY_S), start=first_num):
            values = dict(o.split("=", 1) for o in job)
            noted = known.get(num) if known else None
            if noted is not None and noted.state in NO_JOB_STATES and noted.seen == seen(noted.path):
                runs.append(Run(num, {key: values[key] for key in swept_keys}, noted.label, Path(noted.path),
                                noted.state, noted.error, skipped=noted.state == "done"))
                continue
            cfg = compose(list(job), num)
            check_config(cfg)  # a run that cannot be (k=-1, no method=) is bad input, not a missing run
            runs.append(_check_run(cfg, num, {key: values[key] for key in swept_keys}, logs=logs))
            runs[-1].elsewhere = noted is not None and noted.state == "running"
    return runs


# ---------------------------------------------------------------- runs a sweep gives no job

NO_JOB_STATES = ("done", "damaged")  # runs a launcher gives no job (a run running elsewhere may be done by then)


@dataclass(frozen=True)
class NoJob:
    """A run of a sweep that its launcher gave no job (done or damaged when the sweep started; on SLURM, another
    process's): its state then, its record's path, label and error, and `seen`, what its record file was then."""

    state: str
    path: str
    label: str
    error: str | None
    seen: tuple | None


_NO_JOB: dict[str, dict[int, NoJob]] = {}  # a sweep's folder (hydra.sweep.dir) -> job number -> NoJob


def note_no_job(sweep_dir: str, run: Run) -> None:
    """Remember, for the sweep's summary (this process), a run that its launcher gives no job: it writes no log
    folder, and the summary takes it as it was unless its record changed since (check_jobs `known`)."""
    path = str(run.path)
    _NO_JOB.setdefault(str(sweep_dir), {})[run.num] = NoJob(run.state, path, run.label, run.error, seen(path))


def noted_no_job(sweep_dir: str) -> dict[int, NoJob]:
    """The runs of the sweep in `sweep_dir` that got no job (note_no_job), forgotten as they are handed over."""
    return _NO_JOB.pop(str(sweep_dir), {})


def seen(path: str) -> tuple | None:
    """What a record file is now (its inode, size and modification time), None where there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def record_runs(cfgs: Sequence[DictConfig | Plain], first_num: int = 0) -> list[Run]:
    """Each composed run's record state (STATES), record path and log folder (configs from compose_jobs; `first_num`:
    the job number of the first)."""
    with one_pass():
        return [_check_run(cfg, num, {}) for num, cfg in
                enumerate(progress(cfgs, "checking runs", unit="run", delay=CHECK_BAR_DELAY_S), start=first_num)]


@dataclass
class CheckedBatch:
    """One of Hydra's batches of a sweep (hydra.sweeper.max_batch_size runs), checked: its first job number, its jobs,
    each run's record (Run), and its runs grouped as they will train (fusion.fused_packs: indices into `jobs`, and
    for each group whether it is fine-tuning that trains alone although fuse=true), and each run's planned work
    (config.planned_work: which group a sweep on several devices hands out first)."""

    start: int
    jobs: list[tuple[str, ...]]
    runs: list[Run]
    groups: list[list[int]]
    alone: list[bool]
    work: list[float | None] = field(default_factory=list)


def checked_batches(config_loader: Any, sweep_config: DictConfig, jobs: Sequence[Sequence[str]], first_num: int = 0,
                    size: int | None = None, each: Callable[[DictConfig | Plain], None] | None = None):
    """The jobs composed, their records checked and each batch of `size` grouped (Hydra's batches,
    hydra.sweeper.max_batch_size; None: one), a CheckedBatch per batch, with one progress bar over them all: a sweep's
    plan (peltbench.cli.preflight, the local launcher), holding one batch's configs at a time (100,000 runs' configs
    would take GBs). `each(cfg)`: called with every run's config before its record is read (preflight's checks)."""
    from .fusion import fused_packs

    compose = _Composer(config_loader, sweep_config)
    size = size or max(1, len(jobs))
    bar = progress(desc="checking runs", total=len(jobs), unit="run", delay=CHECK_BAR_DELAY_S)
    try:
        with one_pass():
            for start in range(0, len(jobs), size):
                batch = jobs[start:start + size]
                cfgs, runs = [], []
                for num, job in enumerate(batch, start=first_num + start):
                    cfg = compose(list(job), num)
                    if each is not None:
                        each(cfg)
                    cfgs.append(cfg)
                    runs.append(_check_run(cfg, num, {}, logs=False))  # a plan: the launcher makes the job folders
                    bar.update()
                groups, alone = fused_packs(cfgs)
                yield CheckedBatch(first_num + start, [tuple(job) for job in batch], runs, groups, alone,
                                   [planned_work(cfg) for cfg in cfgs])
    finally:
        bar.close()


def record_states(cfgs: Sequence[DictConfig | Plain]) -> list[str]:
    """The state (STATES) of each composed run's record (configs from compose_jobs)."""
    return [run.state for run in record_runs(cfgs)]


def interrupted_line(cfgs: Sequence[DictConfig], sweep: bool = True, done_before: int = 0,
                     total: int | None = None) -> str:
    """The line Ctrl-C (or SIGTERM) ends a run or sweep with (exit status 130, 143): how many of its runs are done,
    read from the records of `cfgs` (a sweep: the runs it gave a job so far), plus `done_before` (those done when it
    started), of `total` (default: len(cfgs)), and how many can go on from a checkpoint. A run stopped while training
    wrote no record (the members of its fused group that finished first did) but a checkpoint (peltbench.checkpoint),
    and released its claim (peltbench.claim): the same command runs what is not done, from where it stopped."""
    runs = record_runs(cfgs)
    done = done_before + sum(run.state == "done" for run in runs)
    resumable = [run.error for run in runs if run.state == "missing" and (run.error or "").startswith("resumable")]
    how = stopped_by()
    if not sweep:
        if done:
            return f"{how} after the run finished (its record is written)"
        if resumable:
            return (f"{how}: the run did not finish; its checkpoint is written, at {resumable[0].removeprefix('resumable, ')}:"
                    f" rerun the same command to go on from it")
        return f"{how}: the run did not finish and wrote no record; rerun the same command to run it"
    total = len(cfgs) if total is None else total
    going_on = f"; {len(resumable)} of them go on from a checkpoint" if resumable else ""
    return (f"{how}: {done} of {total} runs done, {total - done} not done; rerun the same command to "
            f"run them (done runs are skipped{going_on})")


def compose_jobs(config_loader: Any, sweep_config: DictConfig, jobs: Sequence[Sequence[str]],
                 first_num: int = 0) -> list[DictConfig | Plain]:
    """Each job's config (as the task function will see it, less most of `hydra`), composed fast: as plain data
    where it can (_Composer), to be read, not changed. `first_num`: the job number of the first (Hydra's batches
    after the first start past 0; it names the job's log folder)."""
    compose = _Composer(config_loader, sweep_config)
    return [compose(list(job), num) for num, job in enumerate(jobs, start=first_num)]


class _Composer:
    """Each job's config as Hydra's `load_sweep_config(sweep_config, job)` makes it (less most of `hydra`), but fast.

    Hydra composes every config from its files (~0.1 s each). Here the config-group choices of a job (method=,
    task=, +experiment=) are composed once per distinct set, and the job's other overrides (k=, seed=, method.x=)
    are applied after composition, as Hydra does. Of the `hydra` node only hydra.job.num and hydra.sweep (the job's
    log folder) are kept. Each override line is parsed once (a sweep of 100,000 runs has a few hundred distinct ones).

    `plain` (the default): a job whose overrides each set one existing value (k=500, method.lr=1e-3: what a sweep's
    grid is made of) gets its config as plain data (plain.Plain, read like a DictConfig): the composed config
    resolved once per set of choices, the job's values put in place (copying only the dicts on their way, the rest
    shared between runs), and each plain link `${key}` of the composed config (model_seed: ${seed}) followed again;
    hydra.sweep.subdir is resolved. The same values OmegaConf gives (tests/test_missing.py holds the two together),
    at ~1/100 of the time, for 100,000 runs. Anything else (+key=, ~key, a list or dict value, an interpolation that
    is not a plain link, a `???`) goes through Hydra's own function on a copy of the composed config, as a DictConfig.
    """

    def __init__(self, config_loader: Any, sweep_config: DictConfig, plain: bool = True) -> None:
        self.loader, self.sweep_config, self.plain = config_loader, sweep_config, plain
        use_searchpath(sweep_config.hydra.get("searchpath"))  # the user's method files name their runs' folders
        self.parser = OverridesParser.create()
        self.composed: dict[tuple[str, ...], tuple[DictConfig, _PlainBase | None]] = _compositions(sweep_config, plain)
        self.hydra_part = _HydraPart()  # made once for all the sets this composer composes
        self.lines: dict[str, _Line] = {}
        sweep = {"dir": str(sweep_config.hydra.sweep.dir),
                 "subdir": OmegaConf.to_container(sweep_config.hydra.sweep)["subdir"]}  # resolved per job
        self.sweep = sweep
        self.template = _Template.of(sweep["subdir"])

    def __call__(self, job: list[str], num: int) -> DictConfig | Plain:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        lines = [self.lines.get(line) or self._line(line) for line in job]
        choices = tuple(line.text for line in lines if line.group)
        composed, base = self.composed.get(choices) or self._compose(choices)
        rest = [line for line in lines if not line.group]
        cfg = base.run(rest, num, self.sweep["dir"]) if base is not None else None
        if cfg is not None:
            return cfg
        cfg = copy.deepcopy(composed)
        ConfigLoaderImpl._apply_overrides_to_config([line.override for line in rest], cfg)
        with open_dict(cfg):
            cfg.hydra = {"job": {"num": num}, "sweep": self.sweep}
        return cfg

    def _compose(self, choices: tuple[str, ...]) -> tuple[DictConfig, _PlainBase | None]:
        with _files_parsed_once(), self.hydra_part.active():
            composed = self.loader.load_sweep_config(self.sweep_config, list(choices))
        with open_dict(composed):
            del composed["hydra"]
        self.composed[choices] = composed, _PlainBase.of(composed, self.template) if self.plain else None
        return self.composed[choices]

    def _line(self, text: str) -> _Line:
        """One override line of the sweep, parsed once: whether Hydra treats it as a config-group choice
        (hydra/_internal/defaults_list.py, class Overrides), and for another, the value it sets where it is a plain
        one (what _PlainBase.run puts in place; None where Hydra's own function must apply it)."""
        override = self.parser.parse_override(text)
        group = (self.loader.repository.group_exists(override.key_or_group)
                 and not isinstance(override.value(), dict))
        setting = None
        if not group and override.type == OverrideType.CHANGE and override.package is None:
            value = override.value()
            if isinstance(value, SIMPLE) and not (isinstance(value, str) and (value == "???" or "${" in value)):
                setting = (tuple(override.key_or_group.split(".")), value)
        line = self.lines[text] = _Line(text, override, group, setting, _mark(setting[1]) if setting else None)
        return line


_COMPOSITIONS: dict[tuple, dict] = {}  # a sweep's overrides -> its choices -> (composed config, _PlainBase or None)


def _compositions(sweep_config: DictConfig, plain: bool) -> dict:
    """Where the composers of one sweep keep each set of choices composed (~0.2 s each, 80 for Table 1's grid): one
    place per sweep (its overrides, as cli.sweep_overrides reads them) in this process, so that `peltbench -m`'s
    preflight, its launcher and its summary compose each once. Read, never changed: a run's own config is a copy."""
    overrides = OmegaConf.select(sweep_config, "hydra.overrides", default=None)
    overrides = OmegaConf.to_container(overrides, resolve=False) if isinstance(overrides, DictConfig) else {}
    task, hydra = overrides.get("task"), overrides.get("hydra")  # as given: `${hydra.job.num}` is text here
    if not isinstance(task, list) or not isinstance(hydra, list):
        return {}
    key = (tuple(task), tuple(line for line in hydra if line != "hydra.mode=MULTIRUN"), plain)
    return _COMPOSITIONS.setdefault(key, {})


def forget_compositions() -> None:
    """Compose anew from here on (a new command: its config files may have changed)."""
    _COMPOSITIONS.clear()
    _PARSED.clear()


_PARSED: dict[str, DictConfig] = {}  # a config file's text -> OmegaConf.load's config of it (never handed out itself)


@contextlib.contextmanager
def _files_parsed_once():
    """While Hydra composes a sweep's sets of choices, each config file's YAML is parsed once, not once per set (Table
    1's grid composes 80 sets from the same dozen files): OmegaConf.load, which Hydra's config sources call with the
    open file, answers a text it has parsed with a copy of that config (a fifth of the time of parsing it again)."""
    load = OmegaConf.load

    def load_once(file_):
        if isinstance(file_, (str, os.PathLike)):
            return load(file_)
        text = file_.read()
        if text not in _PARSED:
            _PARSED[text] = load(io.StringIO(text) if isinstance(text, str) else io.BytesIO(text))
        return copy.deepcopy(_PARSED[text])

    OmegaConf.load = load_once
    try:
        yield
    finally:
        OmegaConf.load = load


class _HydraPart:
    """What Hydra makes anew for each set of choices it composes (`load_sweep_config`) but is the same for every set of
    one sweep, made once while a composer composes (`active`): 79 ms a set, not 138 (Table 1's grid composes 80).

    - The config its own defaults merge to (hydra/config, its launcher, sweeper, logging, ...: the leading defaults of
      every set's defaults list, package `hydra`): merged once per such list, each set merged onto a copy of it, the
      rest of its defaults in their order (ConfigLoaderImpl._compose_config_from_defaults_list, as Hydra 1.3 writes it).
    - The copy of the config repository Hydra makes per composition (CachingConfigRepository; a copy, so that a
      searchpath changes it alone): made once, each composition its own cache of the files it loads.
    - Hydra's own config files (`hydra/...`), loaded once: each composition reads their defaults lists and headers
      only; one merged is merged as a copy.
    - The choices a defaults list's interpolations read (`${protocol}_${task}`: defaults_list._create_interpolation_map,
      an OmegaConf config made for every config file of the tree, ~30 a set): made only for a file whose defaults
      list has an interpolation, the only ones Hydra reads it for.

    Each composed config is the one Hydra composes alone, hydra node and all (tests/test_missing.py)."""

    def __init__(self) -> None:
        self.repository: tuple[Any, Any] | None = None  # (Hydra's repository, the copy compositions use)
        self.files: dict[str, Any] = {}  # config path (hydra/...) -> its ConfigResult, loaded once
        self.merged: dict[tuple, DictConfig] = {}  # the leading hydra defaults -> the config they merge to

    @contextlib.contextmanager
    def active(self):
        from hydra._internal import config_loader_impl, config_repository, defaults_list

        caching = config_loader_impl.CachingConfigRepository
        load_config = config_repository.ConfigRepository.load_config
        compose = config_loader_impl.ConfigLoaderImpl._compose_config_from_defaults_list
        interpolation_map = defaults_list._create_interpolation_map

        def repository(delegate):
            if self.repository is None or self.repository[0] is not delegate:
                self.repository = (delegate, copy.deepcopy(delegate))
            repo = caching.__new__(caching)
            repo.delegate, repo.cache = self.repository[1], {}
            return repo

        def load(repo, config_path):
            if self.repository is None or repo is not self.repository[1] or not config_path.startswith("hydra/"):
                return load_config(repo, config_path)
            if config_path not in self.files:
                self.files[config_path] = load_config(repo, config_path)
            return self.files[config_path]

        def choices(overrides, defaults, self_added):  # read by a default of `defaults` that interpolates, or by none
            if any(default.is_interpolation() for default in defaults):
                return interpolation_map(overrides, defaults, self_added)
            return None

        config_loader_impl.CachingConfigRepository = repository
        config_repository.ConfigRepository.load_config = load
        config_loader_impl.ConfigLoaderImpl._compose_config_from_defaults_list = (
            lambda loader, defaults, repo: self._compose(loader, defaults, repo))
        defaults_list._create_interpolation_map = choices
        try:
            yield
        finally:
            config_loader_impl.CachingConfigRepository = caching
            config_repository.ConfigRepository.load_config = load_config
            config_loader_impl.ConfigLoaderImpl._compose_config_from_defaults_list = compose
            defaults_list._create_interpolation_map = interpolation_map

    def _compose(self, loader, defaults, repo) -> DictConfig:
        """ConfigLoaderImpl._compose_config_from_defaults_list, the leading hydra defaults merged once."""
        hydra = 0
        while hydra < len(defaults) and (defaults[hydra].package or "").split(".")[0] == "hydra":
            hydra += 1
        key = tuple((default.config_path, default.package) for default in defaults[:hydra])
        if key not in self.merged:
            self.merged[key] = self._merged(loader, OmegaConf.create(), defaults[:hydra], repo)
        cfg = self._merged(loader, copy.deepcopy(self.merged[key]), defaults[hydra:], repo)
        _strip_defaults(cfg)
        return cfg

    def _merged(self, loader, cfg: DictConfig, defaults, repo) -> DictConfig:
        from hydra.errors import ConfigCompositionException
        from omegaconf import flag_override
        from omegaconf.errors import OmegaConfBaseException

        shared = {id(result.config) for result in self.files.values() if result is not None}
        with flag_override(cfg, "no_deepcopy_set_nodes", True):
            for default in defaults:
                loaded = loader._load_single_config(default=default, repo=repo)
                config = copy.deepcopy(loaded.config) if id(loaded.config) in shared else loaded.config
                try:
                    cfg.merge_with(config)
                except OmegaConfBaseException as e:
                    raise ConfigCompositionException(
                        f"In '{default.config_path}': {type(e).__name__} raised while composing config:\n{e}"
                    ).with_traceback(sys.exc_info()[2])
        return cfg


def _strip_defaults(cfg) -> None:
    """Hydra 1.3's strip_defaults (ConfigLoaderImpl._compose_config_from_defaults_list): each remaining defaults list
    removed from the composed config."""
    from omegaconf import flag_override

    if isinstance(cfg, DictConfig):
        if cfg._is_missing() or cfg._is_none():
            return
        with flag_override(cfg, ["readonly", "struct"], False):
            if cfg._get_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS"):
                cfg._set_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS", None)
                cfg.pop("defaults", None)
        for _key, value in cfg.items_ex(resolve=False):
            _strip_defaults(value)


@dataclass(frozen=True)
class _Line:
    """One override line of a sweep (_Composer._line)."""

    text: str
    override: Any
    group: bool
    setting: tuple[tuple[str, ...], Any] | None  # (path, value) of a plain value it sets, else None
    mark: tuple | None = None  # its value told apart as a record tells it (_mark), for _PlainBase._share


LINK = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")
TEMPLATE = re.compile(r"(?:[^$\\]|\$(?!\{)|" + LINK.pattern + r")*")  # text with plain links, nothing else OmegaConf reads
SIMPLE = (str, int, float, bool, type(None))
_SIMPLE_TYPES = frozenset(SIMPLE)  # exactly these (True is no int here)


@dataclass(frozen=True)
class _Template:
    """The log folder's name (hydra.sweep.subdir) as text and plain links, split once: `text` (n + 1 pieces) around
    `keys` (n dotted keys, as paths)."""

    text: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, subdir: Any) -> _Template | None:
        if not isinstance(subdir, str) or not TEMPLATE.fullmatch(subdir):
            return None
        if any(key.startswith("hydra.") and key != "hydra.job.num" for key in LINK.findall(subdir)):
            return None
        pieces = LINK.split(subdir)  # text, key, text, key, ..., text
        return cls(tuple(pieces[0::2]), tuple(tuple(key.split(".")) for key in pieces[1::2]))

    def fill(self, cfg: Plain, num: int) -> str | None:
        """The name for a job: each link replaced as OmegaConf does (str of the value)."""
        parts = [self.text[0]]
        for key, text in zip(self.keys, self.text[1:]):
            value = num if key == ("hydra", "job", "num") else _at(cfg, key)
            if value is MissingKey or not isinstance(value, SIMPLE):
                return None
            parts.append(str(value))
            parts.append(text)
        return "".join(parts)


def _at(cfg: Plain, path: tuple[str, ...]) -> Any:
    """The value at `path` of a plain config, MissingKey where there is none."""
    node = cfg
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return MissingKey
        node = node[part]
    return node


class _PlainBase:
    """One composed config as plain data (_Composer): its resolved values, its plain links (path, source path) and
    the log folder's template; `of` says None where OmegaConf must compose its jobs."""

    def __init__(self, resolved: Plain, links: list[tuple[tuple[str, ...], tuple[str, ...]]], template: _Template) -> None:
        self.resolved, self.links, self.template = resolved, links, template
        self.follow: dict[tuple, list] = {}  # the paths a job's lines set -> the links to follow again (_followed)
        self.written: dict[tuple, Plain] = {}  # a dict a job's values were put in, by those values (_share)

    @classmethod
    def of(cls, composed: DictConfig, template: _Template | None) -> _PlainBase | None:
        links: list[tuple[tuple[str, ...], str]] = []
        if template is None:
            return None
        if not _links(OmegaConf.to_container(composed, resolve=False), (), links):
            return None  # an interpolation that is more than a link (a resolver, text around it)
        if any(tuple(source.split(".")) == path for path, _ in links for _, source in links):
            return None  # a link to a link
        try:
            resolved = OmegaConf.to_container(composed, resolve=True, throw_on_missing=True)
        except Exception:  # a ??? or a link that does not resolve: OmegaConf says so, per job
            return None
        if omegaconf_strings(resolved):  # a value that reads as an interpolation once resolved (an escaped ${...})
            return None
        return cls(_plain(resolved), [(path, tuple(source.split("."))) for path, source in links], template)

    def _followed(self, changed: tuple[tuple[str, ...], ...]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """The links to follow again where lines set the values at `changed` (a sweep's runs set the same keys)."""
        found = self.follow.get(changed)
        if found is None:
            found = self.follow[changed] = [(path, source) for path, source in self.links if path not in changed and
                                            any(source == to[:len(source)] for to in changed)]
        return found

    def run(self, lines: list[_Line], num: int, sweep_dir: str) -> Plain | None:
        """The job's config with the values of `lines` in place, or None if one of them is not a value set on a
        value."""
        cfg = Plain(self.resolved)
        copied: set[tuple[str, ...]] = set()
        changed, writes = [], []
        for line in lines:
            if line.setting is None:
                return None
            path, value = line.setting
            parent = _writable(cfg, path[:-1], copied) if len(path) > 1 else cfg
            if parent is None or path[-1] not in parent or (type(parent[path[-1]]) not in _SIMPLE_TYPES and
                                                            isinstance(parent[path[-1]], (dict, list, Mapping))):
                return None  # not there, or not a value: Hydra's own function says what it does
            parent[path[-1]] = value
            changed.append(path)
            writes.append((path, line.mark))
        for path, source in self._followed(tuple(changed)):  # a link whose source (or a dict above it) a line set
            value = _at(cfg, source)
            if _at(cfg, path) is not value:
                _writable(cfg, path[:-1], copied)[path[-1]] = value
                writes.append((path, _mark(value)))
        if copied:
            self._share(cfg, copied, writes)
        subdir = self.template.fill(cfg, num)
        if subdir is None:
            return None
        cfg["hydra"] = Plain(job=Plain(num=num), sweep=Plain(dir=sweep_dir, subdir=subdir))
        return cfg

    def _share(self, cfg: Plain, copied: set[tuple[str, ...]], writes: list[tuple[tuple[str, ...], tuple | None]]) -> None:
        """Put in place of each dict this job's values were written into (a copy of the composed one: `_writable`) the
        one an earlier job of these choices got from the same values (`writes`: where, and each value's `_mark`),
        deepest first: a sweep's runs then share their method node per learning rate, their data node
        where every job sets data.dir, and the checks' memo (peltbench.passes) spells each shared node once. Its
        content is the composed one's with these values in it, the same for every job that wrote them; a Plain is never
        changed once made. A job that put a dict or a list somewhere keeps its own copies."""
        if any(mark is None for _, mark in writes):
            return
        if len(self.written) >= 256:  # nodes written with a value of each run's own come once each: kept a while only
            self.written.clear()  # (80 sets of choices × 256 nodes of a few kB at most; Table 1's grid: 85 a set)
        for path in sorted(copied, key=len, reverse=True):
            key = (path, *[write for write in writes if write[0][:len(path)] == path])
            parent = _at(cfg, path[:-1])
            node = self.written.setdefault(key, parent[path[-1]])
            if node is not parent[path[-1]]:
                parent[path[-1]] = node


def _mark(value: Any) -> tuple | None:
    """A value told apart as a record tells it: its type and repr (1, 1.0 and True; 0.0 and -0.0 apart); None for a
    dict or a list (a job that writes one keeps its own copies: _PlainBase._share)."""
    kind = type(value)
    return (kind, repr(value)) if kind in _SIMPLE_TYPES else None


def _links(value: Any, path: tuple[str, ...], found: list) -> bool:
    """Collect (path, source) of every value that is a plain link `${source}`; False if a value is another
    interpolation."""
    if isinstance(value, dict):
        return all(_links(item, (*path, str(key)), found) for key, item in value.items())
    if isinstance(value, list):
        return not any(omegaconf_strings(item) for item in value)
    if isinstance(value, str) and "${" in value:
        match = LINK.fullmatch(value)
        if match is None:
            return False
        found.append((path, match[1]))
    return True


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return Plain({key: _plain(item) for key, item in value.items()})
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _writable(cfg: Plain, path: tuple[str, ...], copied: set) -> Plain | None:
    """The dict at `path` of this job's config, copied (with those above it) the first time it is written."""
    node = cfg
    for depth in range(len(path)):
        child = node.get(path[depth])
        if not isinstance(child, Plain):
            return None
        if path[: depth + 1] not in copied:
            child = node[path[depth]] = Plain(child)
            copied.add(path[: depth + 1])
        node = child
    return node


class MissingKey:
    """select's default where a key is not there."""


def _check_run(cfg: DictConfig, num: int, values: dict[str, str], logs: bool = True) -> Run:
    """The run's record and its state; `logs`: with its Hydra job folder in this sweep (a plan needs none)."""
    results_dir = _absolute(str(cfg.results_dir), os.getcwd())
    label = record_folder(cfg)
    path = results_dir.joinpath(label, "result.json")
    run = Run(num, values, label, path, "missing", log_dir=_log_dir(cfg) if logs else None)
    not_a_record: list[str] = []
    try:
        record = read_record(path, not_a_record, split=False)  # its state needs no row indices
    except UserError as error:  # e.g. a colleague's record we may not read
        run.state, run.error = "unreadable", str(error)
        return run
    if not_a_record:
        run.error = f"its result.json is not a record ({not_a_record[0]}): a rerun replaces it"
    damaged, differences = (None, []) if record is None else against_run(record, cfg)
    if damaged:
        run.state, run.error = "damaged", damaged
    elif differences:
        run.state, run.error = "foreign", "; ".join(differences)
    elif record is not None and record.get("status") == "ok" and unsaved(cfg, path.parent):
        run.error = f"done, but without the {' or '.join(unsaved(cfg, path.parent))} this sweep asks for: it trains again"
    elif record is not None and record.get("status") == "ok":
        run.state = "done"
    elif record is not None and record.get("status") == "pruned":  # stopped by successive halving (peltbench.halving)
        if cfg.get("halving") is not None:
            run.state = "done"  # done for a halving sweep; never in a table
        else:
            run.error = (f"pruned at rung {(record.get('pruned') or {}).get('rung')} by successive halving: "
                         "without halving it trains fully")
    elif (holder := live_claim(path)) is not None:
        run.state, run.error = "running", describe(holder)
    elif record is not None:
        run.state, run.error = "failed", record.get("error")
    else:  # `resumable, epoch 12 of 50`: a checkpoint goes on from there (else why its result.json is no record)
        run.error = progress_of(path.parent, label) or run.error
    return run


def _log_dir(cfg: DictConfig) -> Path | None:
    """The run's Hydra job folder in its sweep (None for a single run's config: no `hydra`)."""
    sweep_dir = select(cfg, "hydra.sweep.dir")
    try:
        return Path(sweep_dir, str(cfg.hydra.sweep.subdir))
    except Exception:  # a custom hydra.sweep.subdir naming other hydra keys; a single run's config (no `hydra`)
        return None if sweep_dir is None else Path(sweep_dir)


@functools.lru_cache(maxsize=64)
def _absolute(results_dir: str, cwd: str) -> Path:
    """`results_dir` as an absolute path from `cwd` (once per sweep, not once per run)."""
    return Path(results_dir).expanduser().absolute()


def _passthrough(arguments: list[str], swept_keys: list[str]) -> list[str]:
    """The arguments that are not swept keys, as given (hydra/launcher=slurm, +experiment=..., results_dir=...)."""
    parser = OverridesParser.create()
    return [arg for arg in arguments if parser.parse_override(arg).get_key_element() not in swept_keys]


def compact(points: list[dict[str, str]], keys: list[str], order: dict[str, list[str]]) -> list[dict[str, list[str]]]:
    """Few cartesian products that together hold exactly `points`.

    Points that differ only in seed merge first (one box with seed=111,222,...); then boxes that differ only
    in another key merge, and so on until nothing merges. Boxes never overlap, so each merge is exact.
    """
    boxes = [{key: (point[key],) for key in keys} for point in points]
    merge_order = (["seed"] if "seed" in keys else []) + [key for key in reversed(keys) if key != "seed"]
    merged = True
    while merged:
        merged = False
        for key in merge_order:
            groups: dict[tuple, list[str]] = {}
            for box in boxes:
                rest = tuple((other, box[other]) for other in keys if other != key)
                groups.setdefault(rest, []).extend(box[key])
            merged |= len(groups) < len(boxes)
            boxes = [{**dict(rest), key: tuple(sorted(values, key=order[key].index))} for rest, values in groups.items()]
    position = {tuple(point[key] for key in keys): i for i, point in enumerate(points)}
    boxes.sort(key=lambda box: position[tuple(box[key][0] for key in keys)])  # by its first run in grid order
    return [{key: list(box[key]) for key in keys} for box in boxes]


def commands(sweep: Sweep, runs: list[Run]) -> list[str]:
    """`peltbench -m ...` commands that run exactly `runs` of the sweep."""
    order = {key: list(dict.fromkeys(run.values[key] for run in sweep.runs)) for key in sweep.swept_keys}
    boxes = compact([run.values for run in runs], sweep.swept_keys, order)
    lines = []
    for box in boxes:
        swept = [f"{key}={','.join(values)}" for key, values in box.items()]
        lines.append(shlex.join(["peltbench", "-m", *sweep.passthrough, *swept]))
    return lines


def report(sweep: Sweep, limit: int | None = None, logs: bool = False, skips: bool = False) -> list[str]:
    """The counts and the runs not done (the first `limit` of them), one line each with its reason.

    logs: say where a missing run's log is; skips: say how many of the done runs this sweep skipped, as done when
    their jobs came or as running elsewhere and done now (from their outcomes: `with_outcomes`).
    """
    finished_there = sum(run.elsewhere and run.state == "done" for run in sweep.runs)
    skipped = sum(run.skipped and run.state == "done" for run in sweep.runs)
    notes = [f"{skipped} of them skipped as already done"] if skips else []
    if finished_there:
        notes.append(f"{finished_there} skipped as running elsewhere and finished there")
    done = f"{sweep.count('done')} done" + (f" ({', '.join(notes)})" if notes else "")
    others = {"running": "running elsewhere", "unreadable": "unreadable", "foreign": "held by another config's record",
              "damaged": "damaged"}
    lines = [f"{len(sweep.runs)} runs: {done}, {sweep.count('failed')} failed, {sweep.count('missing')} missing"
             + "".join(f", {sweep.count(state)} {words}" for state, words in others.items() if sweep.count(state))]
    not_done = sweep.not_done()
    for run in not_done[:limit]:
        if run.state == "missing":
            reason = f": {run.error}" if run.error else ""
            record = "" if run.path.is_file() else f"no record{'' if run.error else ': a config error or a killed job'}; "
            where = f" ({record}its log: {run.log_dir})"
            lines.append(f"  missing  {run.label}{reason}{where if logs else ''}")
        elif run.state == "foreign":
            lines.append(f"  other    {run.path} holds another config's record ({run.error}): move it away or set "
                         f"results_dir")
        elif run.state == "damaged":
            lines.append(f"  damaged  {run.path}: {run.error}; move it away to rerun it")
        else:
            lines.append(f"  {run.state:<8} {run.label}: {run.error}")
    if limit is not None and len(not_done) > limit:
        lines.append(f"  ... and {len(not_done) - limit} more")
    return lines


def main(argv: list[str] | None = None) -> int:
    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `peltbench-missing ... | head` ends quietly
    try:
        return _main(argv)
    finally:  # a caller in this process (a notebook, a test, a sweep after it) keeps its own: Python's makes a closed
        signal.signal(signal.SIGPIPE, previous)  # pipe an OSError (a sweep's worker that ended), never the process's death


def _main(argv: list[str] | None) -> int:
    arguments = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg not in ("-m", "--multirun")]
    if not arguments or any(arg in ("-h", "--help") for arg in arguments):
        print(USAGE, file=sys.stdout if arguments else sys.stderr)
        return 0 if arguments else 2
    try:
        sweep = _load(arguments)
    except KeyboardInterrupt:  # composing a big grid takes a while (18 s for +experiment=table1)
        print("peltbench-missing: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # Hydra's composition and override errors, e.g. an unknown method
        message = (str(error).strip().splitlines() or [type(error).__name__])[0]
        print(f"peltbench-missing: error: {message}", file=sys.stderr)
        return 2
    print("\n".join(report(sweep)))
    to_run = [run for run in sweep.runs if run.state in ("failed", "missing")]
    if to_run:
        print(f"To run only the {len(to_run)} failed and missing runs:")
        print("\n".join(f"  {line}" for line in commands(sweep, to_run)))
    return 0 if not sweep.not_done() else 1


def _load(arguments: list[str]) -> Sweep:
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from .launchers import register_launchers

    register_launchers()  # so that hydra/launcher=slurm composes
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        pinned = pin_group_settings(["-m", *arguments])[1:]  # method.lr=1e-3 beside method=a,b (overrides.py)
        sweep_config = loader.load_configuration(config_name="config", overrides=pinned, run_mode=RunMode.MULTIRUN)
        return check_sweep(loader, sweep_config, arguments, logs=False)  # its report names no log folder


def write_outcome(log_dir: Path, status: str, reason: str | None = None) -> None:
    """Say in a run's log folder how its job ended (read by the sweep's summary): `ok` (trained), `skipped` (done
    when the job came), or why it ended without its record; best effort. A `skipped` does not replace an `ok`: the
    job trained the run itself before it was requeued (SLURM), and skips it on its second start."""
    path = log_dir / OUTCOME_NAME
    try:
        if status == "skipped" and _read_outcome(path).get("status") == "ok":
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"status": status, "reason": reason}) + "\n")
    except OSError as error:
        log.warning("could not write %s: %s", path, error.strerror)


def _read_outcome(path: Path) -> dict:
    try:
        outcome = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return outcome if isinstance(outcome, dict) else {}


def with_outcomes(sweep: Sweep) -> Sweep:
    """What each run's job said (outcome.json): a run skipped (as done, or as running elsewhere) is marked so; a
    missing run gets the reason; one whose job failed is `failed`."""
    for run in sweep.runs:
        if run.log_dir is None:
            continue
        outcome = _read_outcome(run.log_dir / OUTCOME_NAME)
        if not outcome:
            continue
        run.elsewhere = outcome.get("status") == "running"
        run.skipped = outcome.get("status") == "skipped"
        if run.state != "missing" or outcome.get("status") in ("ok", "skipped"):
            continue
        run.error = str(outcome.get("reason"))
        if outcome.get("status") == "failed":  # it ran, and its record could not be written
            run.state = "failed"
    return sweep


class _LastError(logging.Handler):
    """Keeps the first line of the last error peltbench logs during a job: the reason a run left no record."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = (record.getMessage().strip().splitlines() or [None])[0]


class SweepSummary(Callback):
    """The end of `peltbench -m ...`: one screen of counts and of the runs not done, and exit status 1 if any.

    Read from the records and claims, so it is the same whichever launcher ran the sweep; a job that ends without
    its record says why in its log folder (on_job_end runs in the job's process, on SLURM too). Configured in
    conf/config.yaml under hydra.callbacks.
    """

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self.errors: _LastError | None = None  # during a job only

    def __getstate__(self) -> dict:
        """Without the job's error handler (a logging.Handler holds a lock): SLURM pickles the launcher, this callback
        included, when a job checkpoints on its pre-timeout signal, which may come in the middle of a job."""
        return {**self.__dict__, "errors": None}

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.errors = _LastError()
        logging.getLogger("peltbench").addHandler(self.errors)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        logged = self.errors.message if self.errors is not None else None
        logging.getLogger("peltbench").removeHandler(self.errors)
        self.errors = None
        if job_return.status == JobStatus.COMPLETED:
            status, reason = str(job_return.return_value), logged
        else:  # the task raised: its exception is the reason
            error = job_return._return_value
            status, reason = "failed", logged or (str(error).strip().splitlines() or [type(error).__name__])[0]
        if status == "running":
            reason = RUNNING_ELSEWHERE
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # every job's, so that a stale one of a reused folder goes
            done = status in ("ok", "skipped", "pruned")
            write_outcome(Path(HydraConfig.get().runtime.output_dir), status, None if done else reason or "no error was logged")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra

        known = noted_no_job(str(config.hydra.sweep.dir))  # the runs given no job: no log folder, no outcome.json
        sweep = with_outcomes(check_sweep(GlobalHydra.instance().config_loader(), config, known=known))
        lines = report(sweep, self.limit, logs=True, skips=True)
        lines[0] = f"peltbench sweep: {lines[0]}"
        again = shlex.join(["peltbench", *as_given(sys.argv[1:])])
        if sweep.count("failed") or sweep.count("missing"):
            lines.append(f"Rerun the same command to run the failed and missing ones (done runs are skipped): {again}")
        if sweep.count("running"):
            lines.append("Runs running elsewhere are another process's: peltbench-missing with this sweep's arguments "
                         "says when they are done.")
        print("\n".join(lines), flush=True)
        if sweep.not_done():
            sys.exit(1)
