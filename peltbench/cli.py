"""`peltbench`: one experiment per Hydra job, e.g. `peltbench method=unipelt_apl task=cola k=100 seed=111`.

Before Hydra starts anything, `preflight` composes the config of every run the command asks for, as Hydra will,
and checks it (peltbench.config), whether its loggers can start (peltbench.loggers) and whether a local data.dir has
each task's files (peltbench.data): bad input is one line and exit status 2 within a second, before torch loads.
Exit status: 0 done (or already done), 1 a run failed (a sweep: a run is not done), 2 bad input, 130 interrupted
(Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextlib import nullcontext
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, OverrideParseException
from hydra.types import RunMode
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from . import UserError, __version__
from .component import builtin_names
from .config import check_config, method_settings
from .data import check_task_data
from .interrupts import catch_ctrl_c, exit_status, interrupted, interruption, stopped_by
from .launchers import register_launchers
from .loggers import check_can_start
from .overrides import pin_group_settings
from .packaged import options, packaged_config, shadowing, use_searchpath
from .passes import once, one_pass
from .protocols import protocol_name, run_defaults, sweep_seeds
from .missing import forget_compositions
from .record import container
from .tasks import TaskSpec
from .workers import check_run_device, sweep_devices

log = logging.getLogger("peltbench")

USAGE = """\
usage: peltbench method=METHOD task=TASK [KEY=VALUE ...]        one run
       peltbench -m KEY=A,B,... [KEY=VALUE ...]                 a sweep: every combination, one after another
       peltbench -m ... hydra/launcher=slurm                    the sweep as a SLURM job array
       peltbench -m ... hydra.launcher.devices=all              the sweep on every GPU (or [cpu,cpu]), a worker each
       peltbench -m +experiment=NAME                            a paper sweep (conf/experiment/)
       peltbench ... --cfg job                                  print the composed config, run nothing
       peltbench --help | --version | --info [all|config|defaults|plugins|searchpath] | --hydra-help
"""

HELP = USAGE + """
Runs one few-shot GLUE experiment (or, with -m, a grid of them) and writes one result record per run under
results_dir. An identical finished run is skipped, so a sweep is resumed by running it again; what it still lacks,
and the command that runs only that: peltbench-missing SWEEP_ARGUMENTS.

config groups:
  method=         {methods}
  task=           {tasks}
  protocol=       {protocols}  (default unipelt; docs/protocol.md §10)
  objective=      {objectives}  (default classifier; docs/protocol.md §12)
  logger=         {loggers}  (default csv; several: logger=[csv,tensorboard]; none: logger=[])
  +experiment=    {experiments}  (with -m)
  hydra/launcher=slurm   (with -m; hydra.launcher.partition=..., timeout_min=..., runs_per_job=...: docs/slurm.md)

settings (KEY=VALUE; the default shown):
{settings}

method settings (method.KEY=VALUE; each method's values: conf/method/<method>.yaml, or --cfg job):
{method_settings}

protocol settings (set by protocol=NAME; the default unipelt's shown; each protocol's: conf/protocol/<name>.yaml):
{protocol_settings}

objective settings (objective.KEY=VALUE; the default classifier's shown; each objective's: conf/objective/<name>.yaml):
{objective_settings}

logger settings (with that logger chosen):
{logger_settings}

Exit status: 0 done (or already done); 1 a run failed, or a sweep has runs not done; 2 bad input, nothing ran;
130 interrupted (Ctrl-C), 143 terminated (SIGTERM): rerun the same command to go on.
"""

# the config groups a user chooses from (conf/)
GROUPS = ("method", "task", "protocol", "objective", "logger", "experiment")

# What the settings every method has mean; each component's own are in its declaration (peltbench.component), and
# the values each method takes are commented in conf/method/*.yaml.
COMMON_METHOD_HELP = {
    "components": "the PELT components combined: {components}; or a module's import path (docs/components.md)",
    "lr": "learning rate (App. B)",
    "head": "what of the classifier head trains: train, bias (bias only) or frozen",
}


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _run(cfg: DictConfig) -> str:
    from .missing import interrupted_line
    from .runner import run_group, sweep_status  # imported here: torch loads only for a run that will happen

    sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    # Ctrl-C: one line, whether the run finished (for a sweep its launcher says how far the sweep got)
    with nullcontext() if sweep else interruption(lambda: interrupted_line([cfg], sweep=False)):
        [outcome] = run_group([cfg], Path(to_absolute_path(cfg.results_dir)))
        if interrupted():  # what Ctrl-C became was caught on its way (e.g. as a model that did not load)
            raise KeyboardInterrupt
    if sweep:  # the sweep goes on; its summary lists what is not done
        return sweep_status(outcome)
    if outcome.status == "error":
        print(f"peltbench: error: {outcome.error}", file=sys.stderr)
        sys.exit(2)
    if outcome.status == "failed":  # the runner logged why, and wrote a `failed` record a rerun retries
        sys.exit(1)
    return outcome.status


def main() -> None:
    """The `peltbench` command: Ctrl-C ends it with one line (how far it got) and exit status 130, SIGTERM the same
    way with 143; the records written stay valid, a run it stopped wrote none (its folder left as before it started),
    and the same command goes on from there."""
    catch_ctrl_c()
    try:
        _main()
    except KeyboardInterrupt as interrupt:
        print(f"peltbench: {str(interrupt) or f'{stopped_by()}; rerun the same command to go on (done runs are skipped)'}",
              file=sys.stderr)
        sys.exit(exit_status())


def _main() -> None:
    arguments = sys.argv[1:]
    if not arguments:
        print(USAGE + "peltbench --help lists every setting.", file=sys.stderr)
        sys.exit(2)
    if "--version" in arguments:
        print(f"peltbench {__version__}")
        return
    if any(arg in ("-h", "--help") for arg in arguments):
        print(help_text())
        return
    register_launchers()  # so that --info lists them, whatever it composes
    arguments = sys.argv[1:] = pin_group_settings(arguments)  # -m method=a,b method.lr=1e-3 (overrides.py)
    try:
        shown = preflight(arguments)
    except UserError as error:
        print(f"peltbench: error: {error}", file=sys.stderr)
        sys.exit(2)
    if shown is not None:  # `-m ... --cfg job`: Hydra shows no sweep's configs; every run's is shown here
        print(shown, end="")
        return
    _run()


_checked: tuple | None = None  # the overrides of the sweep that preflight composed and checked every run of
_planned: list | None = None   # and, for its local launcher, each batch's runs checked and grouped (checked_plan)


def checked_sweep() -> tuple | None:
    """The overrides of the sweep whose every run `preflight` composed and checked in this process, as Hydra records
    them (hydra.overrides: the task's, then Hydra's own); its sweeper need not compose them again
    (hydra_plugins/peltbench_local/_sweeper.py). None if none."""
    return _checked


def checked_plan(sweep_config: DictConfig, jobs: list[list[str]], size: int) -> list | None:
    """The runs of the sweep whose config is `sweep_config` as `peltbench -m`'s preflight composed, checked and grouped
    them in this process (peltbench.missing.CheckedBatch, a batch each), for its local launcher's plan, when they
    are `jobs` in batches of `size`; handed over once (a sweep's plan is made once). None otherwise: the launcher
    composes and checks them itself."""
    global _planned
    planned, _planned = _planned, None
    if planned is None or checked_sweep() != sweep_overrides(sweep_config):
        return None
    if [batch.start for batch in planned] != list(range(0, len(jobs), size)):
        return None
    if any(list(batch.jobs) != [tuple(job) for job in jobs[batch.start:batch.start + size]] for batch in planned):
        return None
    return planned


def _launched_here(config: DictConfig) -> bool:
    """Whether the sweep's launcher is peltbench's local one, which plans the sweep as preflight checks it."""
    return OmegaConf.select(config, "hydra.runtime.choices", default={}).get("hydra/launcher") == "peltbench_local"


def _plan(loader, config: DictConfig, check) -> list:
    """Every run of the sweep composed, `check`ed (check_config and what preflight gathers) and its record read, each
    of Hydra's batches grouped as the local launcher will train it (peltbench.missing.checked_batches): its plan, made
    once (each run composed and checked once at a sweep's start, not by preflight and again by its launcher)."""
    from .missing import checked_batches, expand

    jobs, _ = expand(loader, config)
    size = OmegaConf.select(config, "hydra.sweeper.max_batch_size", default=None) or len(jobs)
    return list(checked_batches(loader, config, jobs, 0, size, each=check))


def _spelt(node) -> str:
    """A config node as JSON text with sorted keys: equal nodes, equal texts (once per node a sweep's runs share)."""
    return once(_json_text, node)


def _json_text(node) -> str:
    return json.dumps(container(node), sort_keys=True)


def sweep_overrides(config: DictConfig) -> tuple:
    """A composed config's overrides (hydra.overrides.task and .hydra, less the hydra.mode=MULTIRUN that Hydra's -m adds
    to the latter), as checked_sweep gives them."""
    return (tuple(config.hydra.overrides.task),
            tuple(line for line in config.hydra.overrides.hydra if line != "hydra.mode=MULTIRUN"))


def preflight(arguments: list[str]) -> str | None:
    """Compose and check every run's config as Hydra is about to; raise UserError (one line) for bad input.

    Hydra's own errors (an unknown method, a bad override, a key that does not exist) become UserErrors too,
    so every bad input ends the same way. --info, --hydra-help, --experimental-rerun and commands that point
    Hydra at another config tree (-cp, -cd) are left to Hydra (a run still checks its config when it starts).
    Returns the text to print instead of running for `-m ... --cfg job` (each run's config), else None.
    """
    from hydra import initialize_config_module
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    global _checked, _planned
    _checked = _planned = None
    forget_compositions()  # this command composes its runs anew (peltbench.missing shares them within it)
    args = get_args_parser().parse_args(arguments)  # Hydra's own parser: a bad flag exits 2 with its usage
    sweep_cfg = args.multirun and args.cfg is not None  # shown here, one config per run (Hydra refuses it)
    if args.run + args.multirun + (args.cfg is not None and not sweep_cfg) + (args.info is not None) > 1:
        raise UserError("give only one of --run, --multirun (-m), --cfg and --info (-m ... --cfg job shows each run's "
                        "config)")
    if sweep_cfg and args.cfg != "job":
        raise UserError(f"-m with --cfg {args.cfg}: a sweep shows each run's config with --cfg job; for Hydra's "
                        f"settings of one run, drop -m and give one value per key")
    if args.hydra_help or args.shell_completion or args.experimental_rerun or args.config_path or args.config_dir:
        return None
    if args.info is not None:
        return None
    if args.resolve and args.cfg is None:
        raise UserError("--resolve works only with --cfg")
    mode = RunMode.MULTIRUN if args.multirun or "hydra.mode=MULTIRUN" in args.overrides else RunMode.RUN
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        try:
            config = loader.load_configuration(args.config_name or "config", list(args.overrides), run_mode=mode)
            use_searchpath(config.hydra.searchpath)  # the user's own config folders: their method files
            shadowed = shadowing("method")
            if shadowed:
                raise UserError(f"{shadowed[0]}: peltbench ships a method of that name, which Hydra finds first, so "
                                f"this file would never run: give your method (file and `name:`) a name of its own")
            shown, planned = [], None
            devices = sweep_devices(OmegaConf.select(config, "hydra.launcher.devices", default=None)) \
                if mode == RunMode.MULTIRUN and _launched_here(config) else None
            if args.cfg != "hydra":  # `--cfg hydra` shows Hydra's settings, which need no method or task
                loggers, data, protocols = {}, {}, set()

                def check(job: DictConfig) -> None:
                    check_config(job)
                    if devices is not None:
                        check_run_device(job.device, devices)
                    protocols.add(protocol_name(job))
                    logger = job.get("logger")
                    loggers.setdefault(_spelt(logger) if logger is not None else "{}", logger)
                    data_dir = None if job.data.dir is None else str(job.data.dir)
                    task_key = (_spelt(job.task), data_dir)
                    node = job.get("protocol")
                    fit = (job.k, job.dev_size, node.get("dev", "train") if node is not None else "train")
                    data.setdefault(task_key, (job.task, set()))[1].add(fit)

                if mode == RunMode.MULTIRUN and args.cfg is None and _launched_here(config):
                    planned = _plan(loader, config, check)  # its launcher takes the plan (checked_plan)
                else:
                    with one_pass():  # a sweep's runs share their nodes: each checked once (peltbench.passes)
                        for overrides, job in _jobs(loader, config, mode, plain=not sweep_cfg):
                            check(job)
                            if sweep_cfg:
                                shown.append((overrides, job))
                check_protocol_sweep(sorted(protocols), list(args.overrides))
                if args.cfg is None:  # runs will start: their loggers must be able to, their data files be there
                    for logger in loggers.values():
                        check_can_start(logger)
                    for (_, data_dir), (task, fits) in data.items():  # a sweep's task is plain data (missing._Composer)
                        task = task if isinstance(task, DictConfig) else OmegaConf.create(container(task))
                        check_task_data(TaskSpec.from_config(task), data_dir, sorted(fits, key=str))
                    if mode == RunMode.MULTIRUN:
                        _checked, _planned = sweep_overrides(config), planned
        except OverrideParseException as error:
            raise UserError(_bad_override(arguments, error)) from None
        except (HydraException, OmegaConfBaseException, ValueError) as error:  # ValueError: e.g. logger=null
            raise UserError(one_line(error, arguments)) from None
    return _sweep_configs(shown, args.package, args.resolve) if sweep_cfg else None


def check_protocol_sweep(protocols: list[str], overrides: list[str]) -> None:
    """A sweep over several protocols runs them all on one list of seeds (Hydra takes a sweep's default seeds from one
    protocol file), so without `seed=...` each protocol but one would run on seeds that are not its own: refused."""
    if len(protocols) < 2 or any(o.lstrip("+~").split("=")[0] == "seed" for o in overrides):
        return
    own = "; ".join(f"{name}: seed={sweep_seeds(name) or run_defaults(name).seed}" for name in protocols)
    rest = " ".join(o for o in overrides if o.lstrip("+~").split("=")[0] != "protocol")
    raise UserError(f"protocol={','.join(protocols)}: one sweep cannot run each protocol on its own seeds ({own}); "
                    f"sweep one protocol at a time, e.g. `peltbench -m protocol={protocols[0]} {rest}` "
                    f"(or give seed=... for all of them)")


def _sweep_configs(jobs: list[tuple[list[str], DictConfig]], package: str | None, resolve: bool) -> str:
    """`-m ... --cfg job`: each run's config as `--cfg job` shows one run's, headed by its number and overrides."""
    parts = []
    for number, (overrides, job) in enumerate(jobs, start=1):
        with open_dict(job):
            del job["hydra"]
        node = OmegaConf.select(job, package) if package and package != "_global_" else job
        text = OmegaConf.to_yaml(node, resolve=resolve) if isinstance(node, DictConfig) else f"{node}\n"
        parts.append(f"# run {number} of {len(jobs)}: {' '.join(overrides)}\n{text}")
    return "\n".join(parts)


def _jobs(loader, config: DictConfig, mode: RunMode, plain: bool = True):
    """(overrides, config) of each run: the one config, or every job of the sweep (composed as peltbench-missing
    does: `plain`, as plain data where it can, with a progress bar in a terminal for a big sweep)."""
    if mode == RunMode.RUN:
        params = dict(config.hydra.sweeper.params or {})
        if params.get("seed") is not None and str(params["seed"]) == sweep_seeds(protocol_name(config)):
            del params["seed"]  # the protocol's seeds are what -m sweeps by default; one run takes `seed`
        if params:
            raise UserError("this is a sweep (hydra.sweeper.params, e.g. from +experiment=...): run it with -m")
        overrides = list(config.hydra.overrides.task)
        with open_dict(config):
            del config["hydra"]
        return [(overrides, config)]
    from .missing import CHECK_BAR_DELAY_S, _Composer, expand
    from .progress import progress

    jobs, _ = expand(loader, config)
    compose = _Composer(loader, config, plain=plain)
    return ((list(job), compose(list(job), num))
            for num, job in enumerate(progress(jobs, "checking runs", unit="run", delay=CHECK_BAR_DELAY_S)))


def methods_with(setting: str) -> list[str]:
    """The packaged methods whose file has `setting` (e.g. lora_rank: lora, lora_fa, unipelt_apl, ...)."""
    return [name for name in options("method") if setting in (packaged_config(f"method/{name}.yaml") or {})]


def one_line(error: Exception, arguments: list[str] = ()) -> str:
    """Hydra's and OmegaConf's multi-line messages, as one line."""
    text = str(error)
    if "peltbench_slurm" in text:
        return "hydra/launcher=slurm needs hydra-submitit-launcher: pip install 'peltbench[slurm]'"
    key = getattr(error, "full_key", None)
    if isinstance(error, OmegaConfBaseException) and key:
        return f"{key}: {text.splitlines()[0]}"
    if isinstance(error.__cause__, OmegaConfBaseException) and "not in struct" in str(error.__cause__):
        match = re.search(r"override '([^']+)'", text)
        key = match[1] if match else getattr(error.__cause__, "full_key", "")
        group = key.partition(".")[0]
        if group in ("method", "task") and not any(arg.startswith(f"{group}=") for arg in arguments):
            return f"{key}: a {group} setting needs {group}=NAME on the command line"
        if group == "method":  # a setting some methods have: say whose it is
            owners = methods_with(key.partition(".")[2])
            swept = [value for arg in arguments if arg.startswith("method=") for value in arg[7:].split(",")]
            lacking = [name for name in swept if name not in owners]
            having = [name for name in swept if name in owners]
            if owners and lacking:
                apart = (f": sweep the methods that have it apart from the others (-m method={','.join(having)} "
                         f"{key}=...)") if having else ""
                return f"{key}: a setting of {', '.join(owners)}, not of {', '.join(lacking)}{apart}"
        return f"{key}: no such setting (peltbench --help lists them all)"
    missing = re.search(r"Could not load '(?P<group>[\w/]+)/(?P<name>[^'/]+)'", text)
    if missing and missing["group"] in GROUPS:  # a list of choices (logger=[csv,bogus]): Hydra names no options
        group = missing["group"]
        return f"Could not find '{group}/{missing['name']}'; Available options in '{group}': {', '.join(options(group))}"
    lines = [line.strip() for line in text.split("Config search path:")[0].splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    lines[0] = re.sub(r"^In 'config': ", "", lines[0])
    if len(lines) > 2 and lines[1].endswith(":"):  # a heading and its list: "Available options in 'method':" ...
        return f"{lines[0]}; {lines[1]} {', '.join(lines[2:])}"
    return "; ".join(lines)


def _bad_override(arguments: list[str], error: OverrideParseException) -> str:
    """Hydra's parse error does not say which argument it is about: find it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for argument in arguments:
        if not argument.startswith("-"):
            try:
                parser.parse_override(argument)
            except HydraException:
                return f"{argument}: not a valid override ({str(error).splitlines()[0]}; quote values with spaces)"
    return one_line(error)


def help_text() -> str:
    methods = " ".join(options("method"))
    return HELP.format(
        methods=methods, tasks=" ".join(options("task")), protocols=" ".join(options("protocol")),
        loggers=" ".join(options("logger")),
        experiments=" ".join(options("experiment")),
        settings=_rows(documented_keys("config.yaml")),
        method_settings=_rows(method_help()),
        protocol_settings=_rows(documented_keys("protocol/unipelt.yaml")),
        objectives=" ".join(options("objective")),
        objective_settings=_rows(documented_keys("objective/classifier.yaml", "objective.")),
        logger_settings=_rows([row for name in options("logger") for row in documented_keys(f"logger/{name}.yaml", "logger.")]),
    )


def method_help() -> list[tuple[str, str, str]]:
    """(method.KEY, "", help) for the settings every method has, then each built-in component's, as it declares them."""
    common = {**COMMON_METHOD_HELP, "components": COMMON_METHOD_HELP["components"].format(
        components=" ".join(builtin_names()))}
    return [(f"method.{key}", "", text) for key, text in common.items()] + \
        [(f"method.{key}", "", text) for key, (_, text) in method_settings().items()]


_YAML_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_]\w*):(?P<value>[^#]*?)\s*(#\s*(?P<comment>.*))?$")


def documented_keys(relative: str, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, comment) for each `key: value  # comment` line of a packaged YAML file, so that
    --help says what the file says (Hydra's own `hydra:` block and the defaults list are left out)."""
    from importlib import resources

    text = resources.files("peltbench.conf").joinpath(relative).read_text()
    rows, parents = [], []  # parents: (indent, key) of the mappings the current line is inside
    for line in text.splitlines():
        match = _YAML_KEY.match(line)
        if match is None:
            continue
        indent, key, value = len(match["indent"]), match["key"], match["value"].strip()
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = [k for _, k in parents] + [key]
        if not value:  # a mapping: its keys follow, indented
            parents.append((indent, key))
        elif path[0] not in ("defaults", "hydra") and value != "{}":
            rows.append((prefix + ".".join(path), value, match["comment"] or ""))
    return rows


def _rows(rows: list[tuple[str, str, str]]) -> str:
    lines = []
    for key, value, comment in rows:
        left = f"{key}={value}" if value else key
        lines.append(f"  {left:<34} {comment}".rstrip() if len(left) < 34 else f"  {left}\n  {'':<34} {comment}".rstrip())
    return "\n".join(lines)


if __name__ == "__main__":
    main()
