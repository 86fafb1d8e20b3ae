"""Study protocols (conf/protocol/, docs/protocol.md §10): how a study is run and reported, as configuration data.

A protocol file sets the split (`protocol.k`: K in total or per class; `protocol.dev`: where the dev rows come from),
the seeds a sweep uses by default, training length and evaluation interval (`train.*`), whether every method's head
trains (`method.head`), and the statistic tables report (`protocol.statistic`). This module reads them for the
record (identity, folder) and the tables; it imports only omegaconf and the packaged files.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from omegaconf import DictConfig, OmegaConf

from .packaged import options, packaged_config
from .passes import once

DEFAULT = "unipelt"       # today's protocol: records without a `protocol` field ran it
GLUE_MAX_LENGTH = 128     # App. B; every GLUE task file's max_length, and every record's from before task files had one
K_COUNTS = ("total", "per_class", "all")  # K rows in all, K per class, or the whole train split only
DEV_SOURCES = ("train", "per_class", "glue_dev", "glue_dev_halves")
STATISTICS = ("mean", "median")
RESULT_KEYS = ("name", "k", "dev")  # what of the `protocol` node changes a run's results (its identity)
# What each dev source means, for captions and docs: which rows select the best epoch (or step).
SELECTION = {
    "train": "the best epoch on a dev set drawn from the train split",
    "per_class": "the best evaluation on a dev set of K train rows per class",
    "glue_dev": "the best epoch on GLUE dev, which is also the reported set (selection on the reported set)",
    "glue_dev_halves": "the best epoch on one part of GLUE dev, reported on the other part",
}


def protocol_name(config: Mapping | DictConfig | None) -> str:
    """The protocol a config (or a record's `config`) ran under: `unipelt` when it names none (earlier records)."""
    node = (config or {}).get("protocol") if isinstance(config, (dict, Mapping, DictConfig)) else None  # dict first:
    name = node.get("name") if isinstance(node, (dict, Mapping, DictConfig)) else None  # Mapping's check is slow
    return str(name) if name else DEFAULT


@lru_cache(maxsize=None)
def protocol_file(name: str) -> DictConfig | None:
    """conf/protocol/<name>.yaml (never change what it returns); None for an unknown name."""
    return packaged_config(f"protocol/{name}.yaml") if name in options("protocol") else None


@lru_cache(maxsize=None)
def protocol_settings(name: str) -> dict:
    """The `protocol` node of a packaged protocol (name, k, dev, statistic, seeds, head). Read once per protocol (a
    sweep checks every run): never change what it returns."""
    packaged = protocol_file(name)
    if packaged is None:
        raise ValueError(f"protocol={name}: no such protocol; choose from {', '.join(options('protocol'))}")
    return OmegaConf.to_container(packaged.protocol)


def statistic(name: str | None) -> str:
    """What tables report for runs of protocol `name`: "mean" (mean ± std over seeds) or "median" (full_median).
    The one place that decides it; a protocol this version does not know is reported as a mean."""
    if protocol_file(str(name or DEFAULT)) is None:
        return "mean"
    return protocol_settings(str(name or DEFAULT))["statistic"]


def method_overrides(name: str) -> dict:
    """The method settings a protocol sets over every method file's (e.g. lmbff: {"head": "train"})."""
    packaged = protocol_file(name)
    method = packaged.get("method") if packaged is not None else None
    return OmegaConf.to_container(method) if method is not None else {}


@lru_cache(maxsize=256)
def run_defaults(name: str, seed: int | None = None, task: str | None = None,
                 max_length: int | None = None) -> DictConfig:
    """conf/config.yaml with protocol `name`'s top-level values over it, and its settings for `task`
    (conf/protocol_task/<name>_<task>.yaml: e.g. LM-BFF's 256 tokens on RTE) over those: what a run of that protocol
    has unless the command line says otherwise, `seed` filled in so that `model_seed: ${seed}` resolves, and the task
    file's `max_length` (train.max_length's default; GLUE's where not given). Cached: never change what it returns."""
    base = OmegaConf.merge(packaged_config("config.yaml"), {"task": {"max_length": max_length or GLUE_MAX_LENGTH}})
    for packaged in (protocol_file(name), packaged_config(f"protocol_task/{name}_{task}.yaml") if task else None):
        if packaged is None:
            continue
        own = OmegaConf.masked_copy(packaged, [key for key in packaged if key not in ("protocol", "method", "hydra")])
        base = OmegaConf.merge(base, own)
    if seed is not None:
        base.seed = seed
    return base


def default_values(name: str, seed, task: str | None, keys: tuple[str, ...], max_length: int | None = None) -> dict:
    """{key: its value in run_defaults(name, seed, task, max_length)} for the dotted `keys`, worked out once per
    protocol, task, max_length and keys rather than once per seed too (a sweep of 300 seeds, a results dir of them):
    the values, with the run's seed at each key whose default is the seed (`model_seed: ${seed}`). Never change what
    it returns."""
    values, seeded = _unseeded_values(name, task, keys, max_length)
    if seeded is None or seed is None:  # a default that depends on the seed otherwise than by being it; no seed
        return _seed_values(name, seed, task, keys, max_length)
    return {**values, **dict.fromkeys(seeded, seed)} if seeded else values


@lru_cache(maxsize=None)
def _unseeded_values(name: str, task: str | None, keys: tuple[str, ...],
                     max_length: int | None) -> tuple[dict, tuple[str, ...] | None]:
    """default_values' values at seed 0, and the keys whose value is the seed (those that follow seeds 0 and 1); None
    for those where a value depends on the seed in another way."""
    first, second = _seed_values(name, 0, task, keys, max_length), _seed_values(name, 1, task, keys, max_length)
    differ = tuple(key for key in keys if first[key] != second[key])
    if any(first[key] != 0 or second[key] != 1 for key in differ):
        return first, None
    return first, differ


@lru_cache(maxsize=64)
def _seed_values(name: str, seed, task: str | None, keys: tuple[str, ...], max_length: int | None) -> dict:
    defaults = run_defaults(name, seed, task, max_length)
    return {key: OmegaConf.select(defaults, key) for key in keys}


def identity(cfg: DictConfig) -> dict | None:
    """What of the protocol enters a run's identity (record.semantic_config): None at `unipelt` with its own split,
    so every record made before protocols existed keeps its hash."""
    node = cfg.get("protocol")
    if node is None:
        return None
    found = once(_identity_of, node)  # a sweep's runs share their protocol node
    return None if found is None else dict(found)  # the caller's own dict


def _identity_of(node) -> dict | None:
    values = {key: node.get(key) for key in RESULT_KEYS}
    return None if values == _default_identity() else values


@lru_cache(maxsize=None)
def _default_identity() -> dict:
    """RESULT_KEYS of the default protocol (read once: a sweep or a results dir holds many runs; never change it)."""
    return {key: protocol_settings(DEFAULT).get(key) for key in RESULT_KEYS}


def sweep_seeds(name: str) -> str | None:
    """`13,21,42,87,100`: the data seeds a -m sweep of protocol `name` runs by default (its hydra.sweeper.params)."""
    packaged = protocol_file(name)
    params = OmegaConf.select(packaged, "hydra.sweeper.params") if packaged is not None else None
    return None if params is None or "seed" not in params else str(params.seed)


def describe(name: str) -> str:
    """One line for captions: the protocol, its split and what it selects on, and its statistic."""
    settings = protocol_settings(name)
    k = {"per_class": "K train rows per class", "total": "K train rows in total", "all": "the whole train split"}[settings["k"]]
    return (f"protocol {name}: {k}; {SELECTION[settings['dev']]}; "
            f"{'median' if settings['statistic'] == 'median' else 'mean ± std'} over the seeds")


# generate_k_shot_data.py's default `--seed` list, in the order its loop runs them (the outer loop; tasks inside it).
LMBFF_SEED_ORDER = (100, 13, 21, 42, 87)


def lmbff_chain(seed: int, chained: bool) -> tuple[int, ...]:
    """The seeds whose shuffles LM-BFF's script applies to a task's train rows before `seed`'s own (lmbff_split's
    `chain`), for a task whose file it shuffles in place (`chained`: the task file's `lmbff_chained`, CoLA's). Its
    split_header() returns a fresh slice `lines[1:]` for a file with a header, but the list itself for a headerless
    file (CoLA), which np.random.shuffle then shuffles in place, seed after seed of the loop: the released CoLA split
    of a seed is the chain of shuffles over the default seeds up to it. A seed outside the default list is split as
    `--seed SEED` alone splits it: one shuffle of the file order."""
    if not chained or seed not in LMBFF_SEED_ORDER:
        return ()
    return LMBFF_SEED_ORDER[: LMBFF_SEED_ORDER.index(seed)]
