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
training them: each job that ends so writes `outcome.json` into its log folder, and the summary reads it.
"""

from __future__ import annotations

import copy
import functools
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
from typing import Any, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from . import UserError
from .checkpoint import progress_of
from .claim import describe, live_claim
from .config import check_config
from .interrupts import stopped_by
from .overrides import as_given, pin_group_settings
from .progress import progress
from .record import (Plain, config_differences, damage, omegaconf_strings, one_pass, read_record, record_path, select,
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


@dataclass
class Run:
    """One run of a sweep: its job number, its swept key=value pairs, and the state of its record."""

    num: int
    values: dict[str, str]          # swept key -> value, e.g. {"method": "lora", "seed": "111"}
    label: str                      # its record folder under results_dir, e.g. lora/rte/k100/seed111
    path: Path
    state: str                      # one of STATES
    error: str | None = None        # why it is not done: a failed record's error line, the claim's holder, ...
    log_dir: Path | None = None     # the run's Hydra job folder in this sweep
    elsewhere: bool = False         # this sweep skipped it: another process was training it (its outcome.json)
    skipped: bool = False           # this sweep skipped it: it was done when its job came (its outcome.json)


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


def check_sweep(config_loader: Any, sweep_config: DictConfig, arguments: list[str] | None = None) -> Sweep:
    """Compose every run of the sweep whose (multirun) config is `sweep_config` and classify its record."""
    jobs, swept_keys = expand(config_loader, sweep_config)
    runs = check_jobs(config_loader, sweep_config, jobs, swept_keys)
    passthrough = [] if arguments is None else _passthrough(arguments, swept_keys)
    return Sweep(runs, swept_keys, passthrough)


def check_jobs(config_loader: Any, sweep_config: DictConfig, jobs: Sequence[Sequence[str]],
               swept_keys: Sequence[str] = (), first_num: int = 0) -> list[Run]:
    """The state of each job's record (jobs as Hydra's sweeper hands them to a launcher)."""
    compose = _Composer(config_loader, sweep_config)
    runs = []
    with one_pass():
        for num, job in enumerate(progress(jobs, "checking runs", unit="run", delay=CHECK_BAR_DELAY_S), start=first_num):
            values = dict(o.split("=", 1) for o in job)
            cfg = compose(list(job), num)
            check_config(cfg)  # a run that cannot be (k=-1, no method=) is bad input, not a missing run
            runs.append(_check_run(cfg, num, {key: values[key] for key in swept_keys}))
    return runs


def record_runs(cfgs: Sequence[DictConfig | Plain], first_num: int = 0) -> list[Run]:
    """Each composed run's record state (STATES), record path and log folder (configs from compose_jobs; `first_num`:
    the job number of the first)."""
    with one_pass():
        return [_check_run(cfg, num, {}) for num, cfg in
                enumerate(progress(cfgs, "checking runs", unit="run", delay=CHECK_BAR_DELAY_S), start=first_num)]


def record_states(cfgs: Sequence[DictConfig | Plain]) -> list[str]:
    """The state (STATES) of each composed run's record (configs from compose_jobs)."""
    return [run.state for run in record_runs(cfgs)]


def interrupted_line(cfgs: Sequence[DictConfig], sweep: bool = True) -> str:
    """The line Ctrl-C (or SIGTERM) ends a run or sweep with (exit status 130, 143): how many of its runs are done,
    read from their records, and how many can go on from a checkpoint. A run stopped while training wrote no record
    (the members of its fused group that finished first did) but a checkpoint (peltbench.checkpoint), and released its
    claim (peltbench.claim): the same command runs what is not done, from where it stopped."""
    runs = record_runs(cfgs)
    done = sum(run.state == "done" for run in runs)
    resumable = [run.error for run in runs if run.state == "missing" and (run.error or "").startswith("resumable")]
    how = stopped_by()
    if not sweep:
        if done:
            return f"{how} after the run finished (its record is written)"
        if resumable:
            return (f"{how}: the run did not finish; its checkpoint is written, at {resumable[0].removeprefix('resumable, ')}:"
                    f" rerun the same command to go on from it")
        return f"{how}: the run did not finish and wrote no record; rerun the same command to run it"
    going_on = f"; {len(resumable)} of them go on from a checkpoint" if resumable else ""
    return (f"{how}: {done} of {len(cfgs)} runs done, {len(cfgs) - done} not done; rerun the same command to "
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
    log folder) are kept.

    `plain` (the default): a job whose overrides each set one existing value (k=500, method.lr=1e-3: what a sweep's
    grid is made of) gets its config as plain data (record.Plain, read like a DictConfig): the composed config
    resolved once per set of choices, the job's values put in place (copying only the dicts on their way, the rest
    shared between runs), and each plain link `${key}` of the composed config (model_seed: ${seed}) followed again;
    hydra.sweep.subdir is resolved. The same values OmegaConf gives (tests/test_missing.py holds the two together),
    at ~1/100 of the time, for 100,000 runs. Anything else (+key=, ~key, a list or dict value, an interpolation that
    is not a plain link, a `???`) goes through Hydra's own function on a copy of the composed config, as a DictConfig.
    """

    def __init__(self, config_loader: Any, sweep_config: DictConfig, plain: bool = True) -> None:
        self.loader, self.sweep_config, self.plain = config_loader, sweep_config, plain
        self.parser = OverridesParser.create()
        self.composed: dict[tuple[str, ...], DictConfig] = {}
        self.bases: dict[tuple[str, ...], _PlainBase | None] = {}
        self.groups: dict[str, bool] = {}
        self.sweep = {"dir": str(sweep_config.hydra.sweep.dir),
                      "subdir": OmegaConf.to_container(sweep_config.hydra.sweep)["subdir"]}  # resolved per job

    def __call__(self, job: list[str], num: int) -> DictConfig | Plain:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        overrides = [self._parse(line) for line in job]
        is_group = [self._selects_group(o) for o in overrides]
        choices = tuple(o.input_line for o, group in zip(overrides, is_group) if group)
        if choices not in self.composed:
            composed = self.loader.load_sweep_config(self.sweep_config, list(choices))
            with open_dict(composed):
                del composed["hydra"]
            self.composed[choices] = composed
            self.bases[choices] = _PlainBase.of(composed, self.sweep) if self.plain else None
        rest = [o for o, group in zip(overrides, is_group) if not group]
        base = self.bases[choices]
        cfg = base.run(rest, num) if base is not None else None
        if cfg is not None:
            return cfg
        cfg = copy.deepcopy(self.composed[choices])
        ConfigLoaderImpl._apply_overrides_to_config(rest, cfg)
        with open_dict(cfg):
            cfg.hydra = {"job": {"num": num}, "sweep": self.sweep}
        return cfg

    @functools.lru_cache(maxsize=None)
    def _parse(self, line: str) -> Any:
        return self.parser.parse_override(line)

    def _selects_group(self, override: Any) -> bool:
        """Whether Hydra treats it as a config-group choice (hydra/_internal/defaults_list.py, class Overrides)."""
        line = override.input_line
        if line not in self.groups:
            self.groups[line] = (self.loader.repository.group_exists(override.key_or_group)
                                 and not isinstance(override.value(), dict))
        return self.groups[line]


LINK = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")
TEMPLATE = re.compile(r"(?:[^$\\]|\$(?!\{)|" + LINK.pattern + r")*")  # text with plain links, nothing else OmegaConf reads
SIMPLE = (str, int, float, bool, type(None))


class _PlainBase:
    """One composed config as plain data (_Composer): its resolved values, its plain links (path, source key) and the
    log folder's template; `of` says None where OmegaConf must compose its jobs."""

    def __init__(self, resolved: Plain, links: list[tuple[tuple[str, ...], str]], sweep: dict) -> None:
        self.resolved, self.links, self.sweep = resolved, links, sweep

    @classmethod
    def of(cls, composed: DictConfig, sweep: dict) -> _PlainBase | None:
        links: list[tuple[tuple[str, ...], str]] = []
        if not _links(OmegaConf.to_container(composed, resolve=False), (), links):
            return None  # an interpolation that is more than a link (a resolver, text around it)
        if any(tuple(source.split(".")) == path for path, _ in links for _, source in links):
            return None  # a link to a link
        subdir = sweep["subdir"]
        if not isinstance(subdir, str) or not TEMPLATE.fullmatch(subdir):
            return None
        if any(key.startswith("hydra.") and key != "hydra.job.num" for key in LINK.findall(subdir)):
            return None
        try:
            resolved = OmegaConf.to_container(composed, resolve=True, throw_on_missing=True)
        except Exception:  # a ??? or a link that does not resolve: OmegaConf says so, per job
            return None
        if omegaconf_strings(resolved):  # a value that reads as an interpolation once resolved (an escaped ${...})
            return None
        return cls(_plain(resolved), links, sweep)

    def run(self, overrides: list, num: int) -> Plain | None:
        """The job's config with `overrides` in place, or None if one of them is not a value set on a value."""
        cfg = Plain(self.resolved)
        copied: set[tuple[str, ...]] = set()
        changed = set()
        for override in overrides:
            if override.type != OverrideType.CHANGE or override.package is not None:
                return None
            value = override.value()
            if not isinstance(value, SIMPLE) or isinstance(value, str) and (value == "???" or "${" in value):
                return None
            path = tuple(override.key_or_group.split("."))
            parent = _writable(cfg, path[:-1], copied)
            if parent is None or path[-1] not in parent or isinstance(parent[path[-1]], (Mapping, list)):
                return None  # not there, or not a value: Hydra's own function says what it does
            parent[path[-1]] = value
            changed.add(path)
        if changed:
            for path, source in self.links:
                value = select(cfg, source)
                if path not in changed and select(cfg, ".".join(path)) is not value:
                    _writable(cfg, path[:-1], copied)[path[-1]] = value
        subdir = _fill(self.sweep["subdir"], cfg, num)
        if subdir is None:
            return None
        cfg["hydra"] = Plain(job=Plain(num=num), sweep=Plain(dir=self.sweep["dir"], subdir=subdir))
        return cfg


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


def _fill(template: str, cfg: Plain, num: int) -> str | None:
    """The log folder's name: `template` (TEMPLATE) with each link replaced as OmegaConf does (str of the value)."""
    parts = []
    for key in LINK.findall(template):
        value = num if key == "hydra.job.num" else select(cfg, key, default=MissingKey)
        if value is MissingKey or not isinstance(value, SIMPLE):
            return None
        parts.append(str(value))
    pieces = LINK.split(template)  # text, key, text, key, ..., text
    return "".join(piece if i % 2 == 0 else parts[i // 2] for i, piece in enumerate(pieces))


class MissingKey:
    """select's default where a key is not there."""


def _check_run(cfg: DictConfig, num: int, values: dict[str, str]) -> Run:
    results_dir = _absolute(str(cfg.results_dir), os.getcwd())
    path = record_path(cfg, results_dir)
    label = str(path.parent.relative_to(results_dir))
    sweep_dir = select(cfg, "hydra.sweep.dir")
    try:
        log_dir = Path(sweep_dir) / str(cfg.hydra.sweep.subdir)
    except Exception:  # a custom hydra.sweep.subdir naming other hydra keys; a single run's config (no `hydra`)
        log_dir = None if sweep_dir is None else Path(sweep_dir)
    run = Run(num, values, label, path, "missing", log_dir=log_dir)
    not_a_record: list[str] = []
    try:
        record = read_record(path, not_a_record)
    except UserError as error:  # e.g. a colleague's record we may not read
        run.state, run.error = "unreadable", str(error)
        return run
    if not_a_record:
        run.error = f"its result.json is not a record ({not_a_record[0]}): a rerun replaces it"
    damaged = None if record is None else damage(record)
    differences = [] if record is None or damaged else config_differences(record, cfg)
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
    else:
        run.error = progress_of(path.parent, label)  # `resumable, epoch 12 of 50`: a checkpoint goes on from there
    return run


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
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `peltbench-missing ... | head` ends quietly
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
        return check_sweep(loader, sweep_config, arguments)


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

        sweep = with_outcomes(check_sweep(GlobalHydra.instance().config_loader(), config))
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
