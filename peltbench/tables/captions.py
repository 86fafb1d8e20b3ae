"""What a table's caption and its fill-in hints say, read from the pooled runs' protocol (conf/protocol/<name>.yaml).

Captions state how K counts (in total or per class), which rows select the best epoch (or step), which rows are
reported, the statistic over seeds, and each task's main metric as the records name it. A hint is a sweep for the
cells a table shows, under the render's model and protocol: the protocol's K and seeds where the experiment file's
(UniPELT's) cannot run under it, or no command where no run of the protocol can fill the table (few-shot tables
under a full-data protocol).
"""
import shlex
from collections import Counter

from omegaconf import OmegaConf

from ..packaged import options, packaged_config
from ..protocols import DEFAULT, protocol_file, protocol_settings, run_defaults, sweep_seeds
from .names import AVG, TASK_LABELS, TASKS, order_of
from .comparability import PAPER_MODEL, canonical, label_protocol, parse_protocol

# The experiment files that sweep few-shot K only (K = 100, 500, 1000): no full-data protocol runs them; and the one
# that sweeps K = all only, which a protocol of K rows per class (lmbff) cannot run.
FEW_SHOT_SWEEPS = ("table1", "table1_prefix_l50", "table2")
FULL_DATA_SWEEPS = ("table3",)
# The experiment files that sweep one data seed (Tables 3 and 4): a named protocol's first seed for Table 4's timings,
# all its seeds for Table 3's statistic.
ONE_SEED_SWEEPS = ("table4",)
METRIC_NAMES = {"accuracy": "accuracy", "f1": "F1", "f1_macro": "macro F1", "mcc": "Matthews corr.",
                "spearman": "Spearman corr.", "pearson": "Pearson corr."}
def named(selection):
    """The named protocol of a render (`unipelt` unless the label names another)."""
    return label_protocol(selection.protocol)


def settings(selection):
    """The `protocol` node of the render's protocol (UniPELT's for a protocol this version does not know)."""
    name = named(selection)
    return protocol_settings(name if protocol_file(name) is not None else DEFAULT)


def k_words(ks, selection):
    """`K = {100, 500} training examples in total`, `K = 16 training examples per class`."""
    shown = ", ".join(ks)
    shown = f"{{{shown}}}" if len(ks) > 1 else shown
    per = "per class" if settings(selection)["k"] == "per_class" else "in total"
    return f"K = {shown} training examples {per}"


def selection_rows(selection, k, tasks=()):
    """The rows that choose the best epoch (or evaluation step) of a run of K `k`, and any setting chosen on dev, for
    runs of `tasks` (GLUE's if none is named)."""
    source = settings(selection)["dev"]
    if source == "train" and k == "all":
        return f"{reported_set(tasks)}, which is also the reported set (selection on the reported set)"
    if source == "train":
        size = parse_protocol(selection.protocol).get("dev_size", run_defaults(named(selection)).dev_size)
        return f"{size} train rows held out as dev (none of them trained on)"
    short = reported_set(tasks, short=True)
    return {
        "per_class": "a dev set of K train rows per class (none of them trained on)",
        "glue_dev": f"{short}, which is also the reported set (selection on the reported set)",
        "glue_dev_halves": f"one part of {short} (never a reported row)",
    }[source]


def reported_rows(selection, k, tasks=()):
    """What a run of K `k` of `tasks` (GLUE's if none is named) reports on: its task's test set, as the protocol
    splits it."""
    source = settings(selection)["dev"]
    if source == "train" and k == "all":
        source = "glue_dev"
    short = reported_set(tasks, short=True)
    return {
        "train": reported_set(tasks, why=True),
        "per_class": reported_set(tasks, why=True),
        "glue_dev": f"{short} (the selection rows too)",
        "glue_dev_halves": f"the part of {short} not used for selection",
    }[source]


def reported_set(tasks=(), short=False, why=False):
    """The test set of runs of `tasks`, in a caption's words: a GLUE task's is the official GLUE dev split (`short`:
    GLUE dev; `why`: GLUE's test labels are not public); a task of the user's own (docs/tasks.md) the test set its
    task file names; both, each named."""
    glue = ("GLUE dev" if short else "the official GLUE dev split") + (" (GLUE's test labels are not public)" * why)
    own = _own(tasks)
    if not own:
        return glue
    theirs = "the test set its task file names" if len(own) == 1 else "the test set each task file names"
    return theirs if not _glue(tasks) else f"{glue} for GLUE's tasks, {theirs} for {_listed(own)}"


def reported_heading(tasks=(), halves=False):
    """(Table 3's LaTeX heading of what it reports on, the same for its markdown title): GLUE's `GLUE Dev` / `dev`, a
    task of the user's own `the Test Set` / `test set`; `halves` (full_halves): the part not used for selection."""
    own, glue = _own(tasks), _glue(tasks)
    heading, title = (("GLUE Dev", "dev") if not own else ("the Test Set", "test set") if not glue
                      else ("GLUE Dev and the Test Sets", "dev and test sets"))
    if halves:
        return f"the Held-out Part of {heading}", f"held-out part of {title}"
    return heading, title


def _own(tasks):
    """The tasks of `tasks` that are the user's own, as the tables name them."""
    return [TASK_LABELS.get(task, task) for task in tasks if task not in TASKS and task != AVG]


def _glue(tasks):
    """Whether `tasks` has one of GLUE's (or names none: a caption of GLUE's runs)."""
    return not _own(tasks) or any(task in TASKS for task in tasks)


def _listed(names):
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


def statistic_words(reported, seeds_text, ddof, expected):
    """`Mean and standard deviation over data seeds 111, 222 (std with ddof = 1; 5 seeds expected per cell)`."""
    return (f"Median over {seeds_text} (the protocol's statistic; {expected} seeds expected per cell)" if reported == "median"
            else f"Mean and standard deviation over {seeds_text} (std with ddof = {ddof}; {expected} seeds expected per cell)")


def main_metrics(runs, tasks):
    """{task: metric name} each task's records rank by: the test metric whose value their `test.main` is (most
    records'), else their `config.task.main_metric`, else conf/task/<task>.yaml's. However a protocol sets it (lmbff
    may rank STS-B by Pearson), the caption names what the numbers are."""
    metrics = {}
    for task in tasks:
        rows = runs[runs["task"] == task]
        found = _metrics_equal_to_main(rows)
        if not found:
            found = Counter(config.get("task", {}).get("main_metric") for config in rows["config"]
                            if isinstance(config, dict))
            found.pop(None, None)
            found.pop("", None)
        metrics[task] = max(sorted(found), key=found.__getitem__) if found else _task_file_metric(task)
    return metrics


def _metrics_equal_to_main(rows):
    """Counter {name: records} of the test metrics whose value is a record's test.main (one per record, unless two
    coincide: then its `config.task.main_metric` where that is one of them, else each of them), over `rows` at once
    (100,000 records: one comparison per column, not a row at a time)."""
    columns = [column for column in rows.columns if column.startswith("test_") and column != "test_main"]
    found = Counter()
    if not columns or "main" not in rows:
        return found
    main = rows["main"]
    equal = (rows[columns].eq(main, axis=0).to_numpy(dtype=bool) & main.notna().to_numpy()[:, None])
    several = equal.sum(axis=1) > 1
    for index, column in enumerate(columns):
        count = int(equal[~several, index].sum())
        if count:
            found[column.removeprefix("test_")] += count
    configs = rows["config"].to_numpy() if "config" in rows else [None] * len(rows)
    for row in several.nonzero()[0]:
        names = [column.removeprefix("test_") for index, column in enumerate(columns) if equal[row, index]]
        config = configs[row]
        configured = config.get("task", {}).get("main_metric") if isinstance(config, dict) else None
        found.update([configured] if configured in names else names)
    return found


def _task_file_metric(task):
    return packaged_config(f"task/{task}.yaml").main_metric if task in options("task") else "main"


def metric_words(metrics):
    """`CoLA Matthews corr., MRPC F1, STS-B Pearson corr., ... (MNLI matched)`: each task's main metric."""
    tasks = sorted(metrics, key=lambda task: order_of(task, TASKS))
    words = ", ".join(f"{TASK_LABELS.get(task, task)} {METRIC_NAMES.get(metrics[task], metrics[task])}" for task in tasks)
    own = [task for task in tasks if task not in TASKS]  # a task of the user's own: its task file's test set
    return (words + ("; MNLI matched" if "mnli" in metrics else "") +
            (f"; {', '.join(own)}: the test set {'its' if len(own) == 1 else 'their'} task file names, no paper "
             f"number" if own else ""))


def sweep_command(sweep, selection, ks=None, extra=(), tasks=None, data_dir=None, written=None):
    """The sweep that fills an output for the model and protocol this render pools, e.g. `peltbench -m
    +experiment=table1 protocol=lmbff k=16 seed=13,21,42,87,100`; None where the protocol cannot run that sweep
    (a few-shot table under a full-data protocol: `not_under`). `ks`: the K of the cells shown (default: the
    experiment file's, or the protocol's K where the protocol fixes it). `tasks`: the tasks the render shows (the
    sweep runs those of its own tasks, or these where it has none of them; all of its own without `tasks`);
    `data_dir`: the local GLUE directory the pooled runs read (`data.dir`; None: the Hub), so that the sweep runs
    where they did, offline too. `written`: the overrides that repeat the label's parts it holds only as a digest
    (written_out); a digest without one is left out (`sha-...` is no value a run can be given)."""
    name = named(selection)
    ks = None if sweep in FULL_DATA_SWEEPS else ks
    model = selection.model.rpartition("#")[0] or selection.model  # records.split_architectures' PATH#roberta
    words = ["peltbench", "-m", f"+experiment={sweep}", *extra]
    departures = parse_protocol(selection.protocol)
    if protocol_file(name) is not None and name != DEFAULT:
        count = protocol_settings(name)["k"]
        if count == "all" and sweep in FEW_SHOT_SWEEPS or count != "all" and sweep in FULL_DATA_SWEEPS:
            return None
        words.append(f"protocol={name}")
        k = "all" if count == "all" else ",".join(ks) if ks else str(run_defaults(name).k)
        seeds = sweep_seeds(name) or ""
        words += [f"k={k}", f"seed={seeds.split(',')[0] if sweep in ONE_SEED_SWEEPS else seeds}"]
    elif ks:
        words.append(f"k={','.join(ks)}")
    words += _tasks(sweep, tasks)
    words += [] if model == PAPER_MODEL else [f"model.name={model}"]
    words += [] if data_dir is None else [f"data.dir={data_dir}"]
    written = written or {}
    words += [written.get(key) or f"{key}={value}" for key, value in departures.items()
              if key != "protocol" and (key in written or not is_digest(value))]
    return shlex.join(words)


DIGEST = "sha-"  # a label's value held as a digest (objectives._shown: a template, label words, a folder's path)


def is_digest(value):
    return str(value).startswith(DIGEST)


def unwritten(selection, written):
    """The parts of the render's label held only as a digest that no override repeats (sweep_command leaves them
    out)."""
    return [key for key, value in parse_protocol(selection.protocol).items() if is_digest(value) and key not in written]


def written_out(label, configs):
    """{key: override} for each part of `label` it holds only as a digest (`objective.template=sha-1f3a9c2e`): the
    value whole, as the pooled runs' records hold it (`configs`: their configs, which share the label), written as a
    Hydra override (`objective.template="*cls**sent_0*_It_was*mask*.*sep+*"`) that Hydra's parser reads back as that
    value, so a hint's command repeats it. A value no override gives back is left out."""
    keys = [key for key, value in parse_protocol(label).items() if is_digest(value)]
    written = {}
    for config in configs if keys else ():
        for key in keys:
            word = _override(key, _dotted(config, key))
            if word is not None:
                written.setdefault(key, word)
        if len(written) == len(keys):
            break
    return written


def _dotted(config, key):
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def _override(key, value):
    """`key=VALUE` in Hydra's override syntax (strings double-quoted, a mapping as `{k: "v", ...}`), or None where
    Hydra's parser would not read `value` back from it (or it holds `${`, which Hydra would interpolate)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if value is None or "${" in str(value):
        return None
    text = f"{key}={_hydra_value(value)}"
    try:
        parsed = OverridesParser.create().parse_override(text).value()
    except Exception:  # noqa: BLE001 - Hydra's grammar refuses it: no override repeats this value
        return None
    return text if canonical(parsed) == canonical(value) else None


def _hydra_value(value):
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    return canonical(value)


def sweep_tasks(sweep):
    """The tasks the experiment file `sweep` runs, in its order (none for a file without a task sweep)."""
    config = packaged_config(f"experiment/{sweep}.yaml")
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) if config is not None else None
    return [task.strip() for task in str(params.get("task", "")).split(",") if task.strip()] if params else []


def _tasks(sweep, tasks):
    """`task=...` for a sweep narrowed to the render's tasks (nothing when it runs just those, or without `tasks`):
    the ones of the sweep's own tasks the render shows, else the render's (a figure's sweep on tasks it lacks)."""
    own = sweep_tasks(sweep)
    if not tasks or not own:
        return []
    shown = [task for task in own if task in tasks] or sorted(tasks, key=lambda task: order_of(task, TASKS))
    return [] if shown == own else [f"task={','.join(shown)}"]


def not_under(selection):
    """Why a table has no runs and no sweep under this protocol: a few-shot table under a full-data protocol, or
    Table 3 (K = all) under a protocol of K rows per class."""
    if settings(selection)["k"] == "all":
        return (f"Protocol {named(selection)} trains on the whole train split (K = all) only: this table's few-shot rows "
                "(K < all) cannot be run under it; its runs are in Table 3")
    return (f"Protocol {named(selection)} samples K training examples per class: K = all cannot be run under it; its "
            "runs are in Table 1")


def benchmark_words(tasks):
    """What a table's results are on: "GLUE" for GLUE's tasks, a task of the user's own by its name (docs/tasks.md):
    "GLUE and my_task", or "my_task" alone."""
    return _listed(["GLUE"] * any(task in TASKS for task in tasks) + _own(tasks))
