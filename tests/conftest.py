"""Shared fixtures: a tiny BERT checkpoint (hidden 32, 2 layers) and small GLUE files, built here, offline."""

from __future__ import annotations

import csv
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MAX_WORKERS = 8  # make test's -n auto: the suite's longest test file takes about 1/8 of it on one core (loadfile)


def _cores() -> int:
    """The cores this process may run on (taskset, a SLURM job's cpuset), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core this process may use, at most MAX_WORKERS (pytest-xdist's own count is the
    machine's physical cores, whatever the affinity; PYTEST_XDIST_AUTO_NUM_WORKERS=N still decides)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, min(_cores(), MAX_WORKERS))


def _share_the_cores_among_xdist_workers() -> None:
    """Under pytest-xdist (make test: `-n auto`), each worker's torch, and the peltbench commands it starts, get their
    share of the cores (OMP_NUM_THREADS: 1 each for 2 workers on 2 cores), not all of them each: torch's threads of two
    workers on the same cores wait on one another. Before torch is imported; a count set by the user is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, _cores() // workers))
        if "torch" in sys.modules:  # a plugin imported it first
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores_among_xdist_workers()

from hydra import compose, initialize_config_module  # noqa: E402

# The tiny random encoders (hidden 32, 2 layers, O(1) weights) and their word-level vocabulary: peltbench.tiny, which
# peltbench-check-method builds its models with too
from peltbench.tiny import (ENCODERS, O1_INIT, ROBERTA_STYLE, TINY, WORDS, save_tiny_encoder,  # noqa: F401,E402
                            tiny_encoder, tiny_encoder_config, tiny_tokenizer)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach the Hub
os.environ.setdefault("TQDM_DISABLE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_GLUE = REPO.parent / "shared" / "data" / "glue"  # every task's real files, where ../shared is beside the clone
SHIPPED_GLUE = REPO / "data" / "glue"                    # CoLA, SST-2, RTE, shipped with peltbench (data/glue/README.md)
TEST_DEVICE = os.environ.get("PELTBENCH_TEST_DEVICE")   # scripts/check_gpu.py runs the device-sensitive tests on cuda


def tiny_config(num_labels: int = 2):
    from transformers import BertConfig

    return BertConfig(num_labels=num_labels, **TINY)


def tiny_backbone(num_labels: int = 2, seed: int = 0):
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_config(num_labels)).eval()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A local BERT checkpoint directory: random tiny weights plus a word-level uncased vocabulary."""
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"[unused{i}]" for i in range(TINY["vocab_size"] - len(vocab))]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 takes the vocabulary itself; given only vocab_file= it builds a 5-token tokenizer (all [UNK])
    BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True).save_pretrained(folder)
    tiny_backbone().save_pretrained(folder)
    return folder


# Method settings a tiny model (hidden 32) needs where the packaged one cannot fit it: C3A's paper block size 128
# (conf/method/c3a.yaml) does not divide 32, and is refused there in one line. A test that runs every packaged method on
# a tiny model applies these (`tiny_method_overrides` as command-line overrides).
TINY_METHOD_SETTINGS = {"c3a": {"c3a_block_size": 8}}


def tiny_method_overrides(name: str) -> list[str]:
    """`method.KEY=VALUE` overrides that fit method `name` to a tiny model (TINY_METHOD_SETTINGS)."""
    return [f"method.{key}={value}" for key, value in TINY_METHOD_SETTINGS.get(name, {}).items()]


@pytest.fixture(scope="session")
def encoder_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A tiny local checkpoint (random weights + tokenizer) of every supported architecture."""
    root = tmp_path_factory.mktemp("encoders")
    return {model_type: save_tiny_encoder(model_type, root / model_type) for model_type in ENCODERS}


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))


def _rows(task: str, n: int, rng: random.Random) -> tuple[list[str] | None, list[list[str]]]:
    """(header, rows) in the real files' own column layout (see ../shared/data/glue/README.md)."""
    def label2() -> str:
        return str(rng.randint(0, 1))
    if task == "CoLA":
        return None, [["gj04", label2(), "", _sentence(rng)] for _ in range(n)]
    if task == "SST-2":
        return ["sentence", "label"], [[_sentence(rng) + " ", label2()] for _ in range(n)]
    if task == "MRPC":
        return (["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                [[label2(), str(i), str(i + 1), _sentence(rng), _sentence(rng)] for i in range(n)])
    if task == "STS-B":
        header = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"]
        return header, [[str(i), "main", "x", "2012", str(i), "none", "none", _sentence(rng), _sentence(rng),
                         f"{rng.uniform(0, 5):.3f}"] for i in range(n)]
    if task == "QQP":
        return (["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                [[str(i), str(i), str(i), _sentence(rng), _sentence(rng), label2()] for i in range(n)])
    if task == "MNLI":
        header = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2", "gold_label"]
        labels = ["entailment", "neutral", "contradiction"]
        return header, [[str(i), "1", "1", "fiction", _sentence(rng), _sentence(rng), rng.choice(labels)] for i in range(n)]
    header = ["index", "question" if task == "QNLI" else "sentence1", "sentence" if task == "QNLI" else "sentence2", "label"]
    return header, [[str(i), _sentence(rng), _sentence(rng), rng.choice(["entailment", "not_entailment"])] for i in range(n)]


FOLDERS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE")
TRAIN_ROWS, TEST_ROWS = 60, 24


def write_glue(root: Path, train_rows: int = TRAIN_ROWS, test_rows: int = TEST_ROWS) -> Path:
    rng = random.Random(0)
    for folder in FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)
        test_file = "dev_matched.tsv" if folder == "MNLI" else "dev.tsv"
        for name, n in (("train.tsv", train_rows), (test_file, test_rows)):
            header, rows = _rows(folder, n, rng)
            with open(root / folder / name, "w", newline="") as handle:
                writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
                writer.writerows(([header] if header else []) + rows)
    return root


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory) -> Path:
    """Small GLUE files in the classic glue_data layout: 60 train and 24 dev rows per task."""
    return write_glue(tmp_path_factory.mktemp("glue_data"))


@pytest.fixture
def workdir(tmp_path, tiny_checkpoint) -> Path:
    """A user's working folder for the `peltbench` command: GLUE files in glue/ and the tiny BERT in tiny-bert/ (the
    overrides `data.dir=glue model.name=tiny-bert`)."""
    write_glue(tmp_path / "glue")
    shutil.copytree(tiny_checkpoint, tmp_path / "tiny-bert")
    return tmp_path


def _parse_each_yaml_text_once() -> None:
    """OmegaConf.load, with each distinct text parsed once per session (a copy of PyYAML's objects for each load).

    Hydra parses a config's YAML files again for every compose (11 files for a run's config: 25-40% of its time), here
    and in the sweeps the tests run in this process; what a load returns is unchanged (it is a function of the text).
    A text that does not parse raises as before, with its file's name."""
    import copy
    import io

    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    parsed: dict = {}

    def load(file_):
        if isinstance(file_, (str, Path)):
            with io.open(os.path.abspath(file_), "r", encoding="utf-8") as handle:
                return load(handle)
        if not getattr(file_, "read", None):
            raise TypeError("Unexpected file type")
        text = file_.read()
        if text not in parsed:
            stream = io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text)
            stream.name = getattr(file_, "name", "<file>")  # what PyYAML's errors name, as when it reads the file
            parsed[text] = yaml.load(stream, Loader=get_yaml_loader())
        obj = copy.deepcopy(parsed[text])
        if obj is not None and not isinstance(obj, (list, dict, str)):
            raise IOError(f"Invalid loaded object type: {type(obj).__name__}")
        return OmegaConf.create() if obj is None else OmegaConf.create(obj)

    OmegaConf.load = staticmethod(load)


_parse_each_yaml_text_once()
_composed: dict = {}   # overrides -> config
_chosen: dict = {}     # config-group choices (method=, task=, logger=, ...) -> config


def compose_config(*overrides: str):
    """The real packaged config, composed as the `peltbench` command would: once per list of overrides in a session,
    a copy for each call (a test may change it)."""
    import copy

    if overrides not in _composed:
        _composed[overrides] = _compose(overrides)
    return copy.deepcopy(_composed[overrides])


def a_record(*overrides: str, **fields) -> dict:
    """A valid record (record.damage finds nothing) of the run `compose_config(*overrides)` (default method=adapter
    task=rte), as the runner starts it (runner._identity), `ok` with made-up scores, `fields` set over it: for tests of
    what reads or keeps records. `status="failed"` makes it a failed run's (null scores, an error)."""
    from peltbench.record import config_hash
    from peltbench.runner import _identity

    cfg = compose_config(*(overrides or ("method=adapter", "task=rte")))
    record = {**_identity(cfg, config_hash(cfg)), "status": "ok", "test": {"accuracy": 61.0, "main": 61.0},
              "dev_best": {"accuracy": 60.0, "main": 60.0}, "best_epoch": 3, "epochs_run": 13}
    if fields.get("status") == "failed":
        record.update(test=None, dev_best=None, best_epoch=None, error="RuntimeError: boom")
    record.update(fields)
    return record


def _compose(overrides: tuple[str, ...]):
    """Hydra composes a config from its group choices, then applies the other overrides (k=, seed=, method.lr=, ...)
    with ConfigLoaderImpl._apply_overrides_to_config (hydra/_internal/config_loader_impl.py). Done here in those two
    steps, the first once per set of choices (peltbench.missing composes a sweep's jobs so): a test's grid of seeds
    and settings composes once. Anything else (hydra.*, a sweep, what does not parse) is Hydra's compose itself."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        try:
            parsed = OverridesParser.create().parse_overrides(list(overrides))
        except Exception:  # Hydra's compose says what is wrong, as it would
            parsed = None
        if parsed is None or any(o.is_sweep_override() or o.key_or_group.startswith("hydra") for o in parsed):
            return compose(config_name="config", overrides=list(overrides))
        repository = GlobalHydra.instance().config_loader().repository
        values = [o for o in parsed if isinstance(o.value(), dict) or not repository.group_exists(o.key_or_group)]
        choices = tuple(o.input_line for o in parsed if o not in values)
        if choices not in _chosen:
            _chosen[choices] = compose(config_name="config", overrides=list(choices))
    cfg = copy.deepcopy(_chosen[choices])
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    return cfg


def assert_close_to_scale(actual, expected, rel: float = 1e-5, floor: float | None = None, msg=None) -> None:
    """`actual` equals `expected` to float rounding, measured against the tensor's scale: every entry within `rel` of
    the largest |entry| of `expected`, and never less than `floor` (default rel/10: what a tensor of scale 0.1 gets).

    For what is computed two ways (a fused member and its run alone, ours and PEFT's, one pass and two): differently
    ordered float32 sums round relative to the tensor's scale, not to each entry. A per-element tolerance (1e-5
    relative, 1e-6 absolute) fails entries near zero on some machines: issue 40, a 2-core AMD EPYC, where a ModernBERT
    delora_B gradient whose largest entry is 103 differed by 3.1e-5 (3e-7 of its scale) near zero. A real fault (an
    entry off by 1e-3 of the scale) still fails (tests/test_encoders.py)."""
    import torch

    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    atol = max(rel * scale, rel / 10 if floor is None else floor)

    def message(text: str) -> str:
        label = msg(text) if callable(msg) else f"{msg}: {text}" if msg else text
        return f"{label}\n(tolerance {atol:.3g}: {rel:g} of the tensor's scale {scale:.3g})"

    torch.testing.assert_close(actual, expected, rtol=0, atol=atol, msg=message)


def assert_trained_alike(alone: dict, fused: dict, label: str = "") -> None:
    """A fused member's record is its separate run's (docs/fused.md): every epoch's train loss and dev score to float
    rounding, and its test scores."""
    for key in ("train_loss", "dev_main"):
        assert [h[key] for h in alone["history"]] == \
            pytest.approx([h[key] for h in fused["history"]], rel=1e-5, abs=1e-6), (label, key)
    assert alone["test"] == pytest.approx(fused["test"], abs=1e-6), label


def tiny_run_overrides(checkpoint: Path, glue: Path, results: Path) -> list[str]:
    """A run small enough for a test: k=16 with a 20-row dev set, 3 epochs, the tiny model; on the device
    PELTBENCH_TEST_DEVICE names (scripts/check_gpu.py: cuda), else the config's `auto`."""
    device = [f"device={TEST_DEVICE}"] if TEST_DEVICE else []
    return [f"model.name={checkpoint}", f"data.dir={glue}", f"results_dir={results}", "k=16", "dev_size=20",
            "train.epochs=3", "train.patience=2", *device]


@pytest.fixture
def in_process(monkeypatch, capsys):
    """`in_process(*ARGS, cwd=DIR)`: `peltbench ARGS` run in this process from main() on, as the command runs it; its
    exit status, stdout and stderr. For what needs no process of its own (no signal, no second process racing it): a
    process of its own spends 5-10 s importing torch and transformers on 2 cores."""
    from peltbench.cli import main
    from peltbench.data import load_split

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        load_split.cache_clear()  # a test may have changed the files
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["peltbench", *args])
        capsys.readouterr()
        try:
            main()
            status = 0
        except SystemExit as exit:
            status = exit.code or 0
        output = capsys.readouterr()
        return subprocess.CompletedProcess(args, status, output.out, output.err)
    return run
