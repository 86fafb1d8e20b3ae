"""Task data: load a split (a `datasets` dataset, or local CSV, TSV, JSON Lines or Parquet files), the seeded
few-shot split, tokenisation, batches.

The few-shot protocol (UniPELT App. B, docs/protocol.md): perm = numpy.random.default_rng(seed).permutation(n),
train = perm[:K], dev = perm[K:K + 1000], test = the task's test set (GLUE: the official dev split; MNLI: matched).
Other protocols (docs/protocol.md §10): LM-BFF's K per class (`lmbff_split`) and the test set in two parts
(`dev_halves`). Every task, GLUE's and a user's own (peltbench.tasks, docs/tasks.md), is read by the same code.
"""

from __future__ import annotations

import csv
import fnmatch
import functools
import glob
import hashlib
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import UserError
from .hub import use_hub
from .progress import progress
from .protocols import LMBFF_SEED_ORDER, lmbff_chain  # noqa: F401  (re-exported: the split's definition)
from .tasks import Files, TaskSpec, file_format, label_name

SPLITS = ("train", "test")


@dataclass(eq=False)
class Split:
    """The rows of one split: one or two text columns and the labels (int ids, or floats for a regression task)."""

    texts: tuple[list[str], ...]
    labels: np.ndarray
    source: str
    encodings: dict = field(default_factory=dict)  # (tokenizer, max_length) → {row: (input_ids, token_type_ids)}
    digest: str | None = None  # rows_digest's answer, once asked

    def __len__(self) -> int:
        return len(self.labels)


# ---------------------------------------------------------------- where a task's rows are

def task_source(task: TaskSpec, data_dir: str | None) -> tuple[Path, Files] | None:
    """The layout of local files a task's rows are read from (with the folder its relative paths are under), or None
    for its `datasets` dataset: files under data.dir when it is set; the dataset when it is not and the task names
    one; else its files, relative to the directory peltbench started in. A UserError where there are none."""
    if data_dir is None and task.dataset is not None:
        return None
    if not task.files:
        raise UserError(f"task={task.name} reads the datasets dataset {_dataset_name(task)}, not files: data.dir="
                        f"{data_dir} has no meaning for it (leave data.dir unset)")
    root = Path(os.path.expanduser(data_dir if data_dir is not None else ".")).absolute()
    if data_dir is not None and not root.is_dir():
        raise UserError(f"data.dir={data_dir}: no such directory")
    for layout in task.files:
        if any(_matches(root, pattern) for pattern in (layout.train, layout.test)):
            return root, layout
    near = [found for layout in task.files for pattern in (layout.train, layout.test)
            for found in [_near_miss(root, pattern)] if found]
    expected = " or ".join(str(root / layout.train) for layout in task.files)
    if near:
        hint = f"; found {near[0]}: rename it (file and folder names are case-sensitive)"
    elif task.dataset is not None and data_dir is not None:
        hint = f"; or leave data.dir unset: task {task.name} reads {_dataset_name(task)} with datasets (README: Offline use)"
    else:
        hint = ""
    raise UserError(f"no {task.name} data under {root} ({_root_of(data_dir)}): expected {expected}{hint}")


def _root_of(data_dir: str | None) -> str:
    """What the folder a task's relative `files` are read under is (docs/tasks.md): data.dir where it is set, else
    the directory peltbench started in."""
    return "data.dir" if data_dir is not None else "the directory peltbench started in, as data.dir is not set"


def _dataset_name(task: TaskSpec) -> str:
    return "/".join(part for part in (task.dataset.path, task.dataset.name) if part)


def _matches(root: Path, pattern: str) -> list[str]:
    """The files a layout's path (a glob) names under `root`, sorted (shards in order)."""
    path = str(root / os.path.expanduser(pattern))
    if not glob.has_magic(path):
        return [path] if os.path.isfile(path) else []
    return sorted(file for file in glob.glob(path) if os.path.isfile(file))


def _near_miss(root: Path, pattern: str) -> str | None:
    """A path under `root` that `pattern` names but for the case of its letters (`rte/train.tsv` for RTE/train.tsv)."""
    node = root
    parts = Path(pattern).parts
    if Path(pattern).is_absolute():
        return None
    for index, part in enumerate(parts):
        try:
            entries = sorted(entry.name for entry in os.scandir(node))
        except OSError:
            return None
        found = [name for name in entries if fnmatch.fnmatchcase(name.lower(), part.lower())]
        if not found:
            return None
        exact = [name for name in found if fnmatch.fnmatchcase(name, part)]
        node = node / (exact or found)[0]
    return str(node.relative_to(root)) if node != root / pattern and node.exists() else None


def check_task_data(task: TaskSpec, data_dir: str | None, runs=()) -> None:
    """That the task's train pool and test set can be read and are good (columns, labels, text, rows), as a run
    reads them (load_split, whose cache the runs of this process then share), and that each of `runs` ((k, dev_size,
    protocol.dev) of a run) fits them as its split will draw it; else a UserError naming the task and the file, split
    or K. A sweep calls it for each task before its first run starts (peltbench.cli.preflight), torch unloaded."""
    try:
        train, test = (load_split(task, data_dir, split) for split in SPLITS)
        for k, dev_size, dev in runs:
            check_split_fits(task, train, test, k, dev_size, dev)
    except UserError as error:
        message = str(error)
        raise UserError(message if message.startswith(f"task={task.name}") else f"task={task.name}: {message}") \
            from None


def check_split_fits(task: TaskSpec, train: Split, test: Split, k, dev_size: int, dev: str) -> None:
    """That a run's k (and dev_size) fit the task's rows under its protocol's dev source (`protocol.dev`): the
    UserError its split would raise (runner.split_rows), without drawing it."""
    if dev == "per_class":
        check_lmbff(lmbff_classes(train.labels, task.lmbff_threshold), int(k))
    elif k != "all":
        check_few_shot(len(train), int(k), int(dev_size))
    elif dev == "glue_dev_halves":
        check_halves(len(test), f"{task.name}'s test set ({test.source})")


# ---------------------------------------------------------------- loading

@functools.lru_cache(maxsize=32)
def load_split(task: TaskSpec, data_dir: str | None, split: str) -> Split:
    """`split` is "train" (the training pool) or "test" (the reported test set). Cached per process, so a local sweep
    reads each file once."""
    source = task_source(task, data_dir)
    if source is None:
        return _load_dataset(task, split)
    root, layout = source
    pattern = layout.train if split == "train" else layout.test
    files = _matches(root, pattern)
    if not files:
        under = "" if Path(pattern).is_absolute() else f" (under {_root_of(data_dir)})"
        raise UserError(f"data file not found: {root / pattern}{under}")
    parts = [read_file(Path(file), layout, task) for file in files]
    if len(parts) == 1:
        return parts[0]
    texts = tuple([text for part in parts for text in part.texts[column]] for column in range(len(layout.text)))
    return Split(texts, np.concatenate([part.labels for part in parts]), parts[0].source)


def read_file(path: Path, layout: Files, task: TaskSpec) -> Split:
    """One file of a layout, in its format; every row checked (text columns hold text, labels are the task's)."""
    if not path.is_file():
        raise UserError(f"data file not found: {path}")
    kind = file_format(layout, str(path))
    source = f"{kind}:{path.parent}"
    if kind in ("tsv", "csv"):
        texts, labels, where = _read_delimited(path, layout, kind)
    elif kind == "json":
        texts, labels, where = _read_table(_json_table(path), layout, str(path), lambda row: f"{path}, line {row + 1}")
    elif kind == "parquet":
        texts, labels, where = _read_table(_parquet_table(path), layout, str(path), lambda row: f"{path}, row index {row}")
    else:
        raise UserError(f"{path}: which format? name it in the task's files (format: tsv, csv, json or parquet), or "
                        f"use the extension .tsv, .csv, .jsonl or .parquet")
    return Split(texts, label_array(labels, task, where), source)


def _read_delimited(path: Path, layout: Files, kind: str):
    """A TSV (glue_data's: tab-separated, quoting off, as GLUE text has bare quotes) or a CSV (comma-separated, quoted
    fields as Python's csv module and spreadsheets write them); a row with another number of fields is an error."""
    if kind == "tsv":
        reader = csv.reader(io.StringIO(_utf8_text(path), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(_utf8_text(path), newline=""))
    try:
        rows = list(reader)
    except csv.Error as error:
        raise UserError(f"{path}, line {reader.line_num}: not CSV ({error})") from None
    start = 1 if layout.header else 0
    columns = _column_indices(path, rows[0] if rows else [], layout)
    width = len(rows[0]) if rows else 0  # every row has as many fields as the first (header or data)
    separated = "tab-separated" if kind == "tsv" else "comma-separated"
    texts: tuple[list[str], ...] = tuple([] for _ in layout.text)
    labels, lines = [], []
    for line, row in enumerate(rows[start:], start=start + 1):
        if not row:
            continue
        if len(row) != width or len(row) <= max(columns):
            raise UserError(f"malformed row in {path}, line {line}: expected {width} {separated} fields, found {len(row)}")
        for column, out in zip(columns[:-1], texts):
            out.append(row[column])
        labels.append(row[columns[-1]])
        lines.append(line)
    if not labels:
        raise UserError(f"{path}: no data rows" + (" (only a header)" if rows and layout.header else ""))
    return texts, labels, lambda row: f"malformed row in {path}, line {lines[row]}"


def _utf8_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise UserError(f"{path}: not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}); "
                        f"task files are UTF-8") from None


def _column_indices(path: Path, header: list[str], layout: Files) -> list[int]:
    """Indices of the text columns, then the label column."""
    wanted = [*layout.text, layout.label]
    if not layout.header:
        bad = [c for c in wanted if not isinstance(c, int) or c < 0]
        if bad:
            raise UserError(f"{path}: header: false, so columns are 0-based indices, not {bad[0]!r}")
        return [int(c) for c in wanted]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise UserError(f"{path}: header lacks column(s) {missing} (found {header})")
    return [header.index(c) for c in wanted]


def _json_table(path: Path):
    """JSON Lines (one object a line), or a JSON array of objects, as an Arrow table (pyarrow: as `datasets` reads it)."""
    import pyarrow as pa
    import pyarrow.json as pa_json

    if not path.read_bytes().strip():
        raise UserError(f"{path}: no data rows")
    try:
        return pa_json.read_json(str(path))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    import json

    try:  # a JSON array of objects, which pyarrow's line reader does not take
        rows = json.loads(_utf8_text(path))
    except ValueError:
        rows = None
    if isinstance(rows, list) and all(isinstance(row, dict) for row in rows):
        try:
            return pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    raise UserError(f"{path}: not JSON Lines of one object a row ({first_line})")


def _parquet_table(path: Path):
    import pyarrow.parquet as pq

    try:
        return pq.read_table(str(path))
    except Exception as error:  # pyarrow's errors for a truncated or foreign file
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"{path}: not a readable parquet file ({first_line})") from None


def _read_table(table, layout: Files, name: str, where):
    """Texts and labels of an Arrow table (a JSON Lines or Parquet file, a `datasets` split, `name`): the columns
    named, each text column holding text, no row empty. `where(row)` names a row."""
    import pyarrow as pa

    wanted = [*layout.text, layout.label]
    missing = [c for c in wanted if c not in table.column_names]
    if table.num_rows == 0:
        raise UserError(f"{name}: no data rows")
    if missing:
        raise UserError(f"{name}: missing column(s) {missing} (found {table.column_names})")
    texts = []
    for name in layout.text:
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            values = column.to_pylist()
            row = next((i for i, value in enumerate(values) if not isinstance(value, str)), 0)
            raise UserError(f"{where(row)}: column {name} holds {values[row]!r}, not text (a {column.type} column)")
        if column.null_count:
            row = next(i for i, value in enumerate(column.to_pylist()) if value is None)
            raise UserError(f"{where(row)}: column {name} is empty (null), not text")
        texts.append(column.to_pylist())
    return tuple(texts), table.column(layout.label).to_pylist(), where


def _load_dataset(task: TaskSpec, split: str) -> Split:
    """A split of the task's `datasets` dataset: load_dataset(path, name, split=...), from the Hub or, offline
    (HF_DATASETS_OFFLINE=1, or no network), from the local datasets cache."""
    import datasets

    use_hub()  # fails fast without a network
    name = task.dataset.train if split == "train" else task.dataset.test
    label = _dataset_name(task)
    try:
        rows = datasets.load_dataset(task.dataset.path, task.dataset.name, split=name)
    except Exception as error:  # network, offline mode, missing cache: all end the same way for the user
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        offline = ("Point data.dir at a local copy of its files (README: Offline use)" if task.files else
                   "Load it once online (or set HF_DATASETS_OFFLINE=1 to read the local datasets cache)")
        raise UserError(f"could not load {label} ({name}) from the Hugging Face Hub or the local datasets cache: "
                        f"{first_line}. Offline? {offline}.") from error
    layout = Files(train=name, test=name, format=None, header=True, text=task.text, label=task.label)
    table = rows.with_format("arrow")[:] if len(rows) else rows.data.table
    texts, labels, where = _read_table(table, layout, f"{label} ({name} split)",
                                       lambda row: f"{label} ({name} split), row index {row}")
    return Split(texts, label_array(labels, task, where), f"hub:{label}/{name}")


# ---------------------------------------------------------------- labels

def label_array(labels, task: TaskSpec, where) -> np.ndarray:
    """The labels as an array, every one checked at once (QQP has 364k). A class label is one of the task's
    label_names (its id) or an integer id; a regression label a number, within label_range. NaN, infinite, out of
    range or not a label is a UserError naming the row, `where(row)` (a file and line, or a file or split and row)."""
    labels = list(labels)
    values = _numbers(labels, task)
    if task.is_regression:
        low, high = task.label_range or (-math.inf, math.inf)
        bad = (values < low) | (values > high)
    else:
        low, high = 0, task.num_labels - 1
        bad = (values < low) | (values > high) | (np.mod(values, 1) != 0)
    bad |= ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise UserError(f"{where(row)}: label {_shown(labels[row], values[row])} is not valid for {task.name} "
                        f"({_why(labels[row], values[row], task, low, high)})")
    return values.astype(np.float32 if task.is_regression else np.int64)


def _numbers(labels: list, task: TaskSpec) -> np.ndarray:
    """Each label as a float: a class name as its id, a number (or its text) as itself; NaN for anything else."""
    ids = {name: index for index, name in enumerate(task.label_names or ())}
    if not ids and all(type(value) is int for value in labels):  # the usual ids: no per-row work
        return np.asarray(labels, dtype=np.float64)
    out = np.empty(len(labels), dtype=np.float64)
    for row, value in enumerate(labels):
        if isinstance(value, (str, bool)) and label_name(value) in ids and not task.is_regression:
            out[row] = ids[label_name(value)]
        elif isinstance(value, str):
            try:
                out[row] = float(value)
            except ValueError:
                out[row] = np.nan
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[row] = value
        else:
            out[row] = np.nan
    return out


def _shown(raw, value: float):
    """A label as the message shows it: a number parsed from text as that number (2, 5.2, nan), else as the file has it
    (null: an empty one)."""
    if raw is None:
        return "null"
    if isinstance(raw, str) and not math.isnan(value):
        value = float(value)
        return repr(int(value)) if value.is_integer() else repr(value)
    if isinstance(raw, str) and raw.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity"):
        return repr(float(raw))
    return repr(raw)


def _why(raw, value: float, task: TaskSpec, low, high) -> str:
    if raw is None:
        return "empty: every row of the task needs a label"
    if math.isnan(value) and not (isinstance(raw, float) or isinstance(raw, str) and raw.strip().lower() == "nan"):
        if task.is_regression:
            return "a regression label is a number"
        names = f"one of label_names {', '.join(task.label_names)}, or " if task.label_names else ""
        return f"a label is {names}a class id {low} to {high}; is `label:` the label column?"
    if not np.isfinite(value):
        return "not a finite number"
    hint = ", an unlabelled test split?" if value == -1 else ""
    return f"valid: {low:g} to {high:g}{hint}"


# ---------------------------------------------------------------- a task's rows, as a record identifies them

def rows_digest(split: Split) -> str:
    """sha256 of a split's rows as read: their texts and labels, in order (what decides a run's numbers, whatever
    file format, column order or unused columns held them). Computed once per loaded split."""
    if split.digest is None:
        digest = hashlib.sha256()
        for column in split.texts:
            digest.update(np.fromiter(map(len, column), dtype=np.int64, count=len(column)).tobytes())
            digest.update("".join(column).encode("utf-8", "surrogatepass"))
        digest.update(split.labels.dtype.str.encode())
        digest.update(np.ascontiguousarray(split.labels).tobytes())
        split.digest = digest.hexdigest()
    return split.digest


def data_digest(task: TaskSpec, data_dir: str | None) -> str:
    """The train pool's and test set's rows together (rows_digest), as this process reads them (load_split)."""
    return hashlib.sha256("".join(rows_digest(load_split(task, data_dir, split)) for split in SPLITS).encode()
                          ).hexdigest()[:16]



# ---------------------------------------------------------------- the few-shot split

def few_shot_split(num_train: int, k: int, seed: int, dev_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and dev row indices (App. B): the same permutation `datasets.Dataset.shuffle(seed=seed)` makes."""
    check_few_shot(num_train, k, dev_size)
    permutation = np.random.default_rng(seed).permutation(num_train)
    return permutation[:k], permutation[k : k + dev_size]


def check_few_shot(num_train: int, k: int, dev_size: int) -> None:
    if k + dev_size > num_train:
        raise UserError(
            f"k={k} is too large: the train split has {num_train} rows and k + dev_size ({k} + {dev_size}) "
            f"must not exceed it"
        )


def lmbff_classes(labels: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """The classes LM-BFF's split samples K rows of: the labels, or a regression task's scores classed at `threshold`
    (its tools/generate_k_shot_data.py groups STS-B by `0 if float(line[-1]) < 2.5 else 1`, for sampling only)."""
    return labels if threshold is None else (labels >= threshold).astype(np.int64)


def check_lmbff(classes: np.ndarray, k: int) -> None:
    """A class with fewer than 2K rows is refused: LM-BFF's script would silently write a smaller dev set."""
    values, counts = np.unique(classes, return_counts=True)
    short = [(value, count) for value, count in zip(values.tolist(), counts.tolist()) if count < 2 * k]
    if short:
        raise UserError(f"k={k}: LM-BFF's split takes 2K = {2 * k} train rows of each class (K train, K dev), and "
                        f"class {short[0][0]} has {short[0][1]}")


def lmbff_split(labels: np.ndarray, k: int, seed: int, threshold: float | None = None,
                chain: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Train and dev row indices of LM-BFF's split (Gao et al. 2021; princeton-nlp/LM-BFF
    tools/generate_k_shot_data.py), the rows that script writes for the same seed:

        np.random.seed(seed)                            # once per task and seed
        train_header, train_lines = split_header(task, dataset["train"])   # CoLA has no header
        np.random.shuffle(train_lines)
        label_list[label].append(line)                  # labels in order of first appearance
        for line in label_list[label][:k]: ...          # train.tsv
        for line in label_list[label][k:k*dev_rate]:    # dev.tsv, dev_rate = 2

    Shuffling row indices consumes numpy's legacy stream exactly as shuffling the lines does. `labels` are the train
    rows' labels in file order (a regression task's scores, classed at `threshold`: lmbff_classes). `chain`: the seeds
    whose shuffles came first, in order (lmbff_chain: CoLA's in-place shuffles). A class with fewer than 2K rows is
    refused (check_lmbff).
    """
    classes = lmbff_classes(labels, threshold)
    check_lmbff(classes, k)
    order = list(range(len(labels)))
    for earlier in (*chain, seed):
        np.random.RandomState(earlier).shuffle(order)  # = np.random.seed(seed); np.random.shuffle(train_lines)
    groups: dict = {}
    for row in order:
        groups.setdefault(classes[row].item(), []).append(row)
    train = [row for rows in groups.values() for row in rows[:k]]
    dev = [row for rows in groups.values() for row in rows[k : 2 * k]]
    return np.array(train, dtype=np.int64), np.array(dev, dtype=np.int64)


def dev_halves(num_rows: int, seed: int, where: str = "GLUE dev") -> tuple[np.ndarray, np.ndarray]:
    """GLUE dev in two parts, (selection rows, test rows), as ReFT's pyreft examples/loreft/train.py sizes them:
    1,000 rows select when GLUE dev has over 5,000, else n // 2; the rest is reported. The rows are a permutation
    of GLUE dev from the data seed (pyreft's torch.utils.data.random_split draws from torch's global generator
    after its model is built: not reproducible outside it). Each part sorted, in the official dev order.
    Fewer than 2 rows (a part would be empty) is a UserError naming `where`, the split."""
    check_halves(num_rows, where)
    selection = 1000 if num_rows > 5000 else num_rows // 2
    permutation = np.random.default_rng(seed).permutation(num_rows)
    return np.sort(permutation[num_rows - selection :]), np.sort(permutation[: num_rows - selection])


def check_halves(num_rows: int, where: str) -> None:
    if num_rows < 2:
        raise UserError(f"{where} has {num_rows} row{'s' if num_rows != 1 else ''}: protocol full_halves splits it in "
                        f"two (one part selects the epoch, the other is reported), so it needs at least 2")


# ---------------------------------------------------------------- tokenisation and batches

@dataclass
class Encoded:
    """Tokenised rows of one subset, with labels, ready to batch. An evaluation set may hold `samples` inputs of each
    row (LM-BFF's demonstration sets: sample after sample, `labels` repeated), whose outputs are averaged
    (train.mean_over_samples)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: np.ndarray
    samples: int = 1

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def row_labels(self) -> np.ndarray:
        """Each row's label once (the first of its `samples` inputs')."""
        return self.labels[: len(self.labels) // self.samples]

    def draw(self, step: int, rows: list[int]) -> None:
        """Before a training step: a set whose inputs change from step to step (demonstrations.DemonstrationTrain)
        builds those of `rows` here; a plain set's are fixed."""


def encode(split: Split, indices, tokenizer, max_length: int, prompt=None) -> Encoded:
    """Tokenise the given rows, each row once per process and tokenizer (a sweep reuses them); with a cloze `prompt`
    (peltbench.cloze.Prompt), each row built by its template as LM-BFF builds it (`encode_prompted`)."""
    if prompt is not None:
        return encode_prompted(split, indices, tokenizer, max_length, prompt)
    cache = split.encodings.setdefault((tokenizer.name_or_path, max_length), {})
    indices = [int(i) for i in indices]
    todo = sorted(set(i for i in indices if i not in cache))
    bar = progress(total=len(todo), desc="tokenise", unit="row")  # k=all tokenises a whole train split
    for start in range(0, len(todo), 4096):
        chunk = todo[start : start + 4096]
        columns = [[texts[i] for i in chunk] for texts in split.texts]
        out = tokenizer(*columns, truncation=True, max_length=max_length)
        types = out.get("token_type_ids") or [[0] * len(ids) for ids in out["input_ids"]]
        for i, ids, type_ids in zip(chunk, out["input_ids"], types):
            cache[i] = (ids, type_ids)
        bar.update(len(chunk))
    bar.close()
    return Encoded([cache[i][0] for i in indices], [cache[i][1] for i in indices], split.labels[indices])


def encode_prompted(split: Split, indices, tokenizer, max_length: int, prompt) -> Encoded:
    """Each row through LM-BFF's `tokenize_multipart_input` with the prompt's template (peltbench.templates), cut to
    max_length; every token of segment 0, as LM-BFF's model receives them (templates.py). A row whose cut removes
    the mask is refused in one line (LM-BFF's code stops there too)."""
    from .templates import tokenize_multipart_input

    cache = split.encodings.setdefault((tokenizer.name_or_path, max_length, prompt), {})
    indices = [int(i) for i in indices]
    todo = sorted(set(i for i in indices if i not in cache))
    for i in progress(todo, desc="tokenise", unit="row"):  # k=all builds a whole train split, row by row
        row = tokenize_multipart_input([texts[i] for texts in split.texts], max_length, tokenizer, prompt.template,
                                       first_sent_limit=prompt.first_sent_limit,
                                       other_sent_limit=prompt.other_sent_limit, truncate_head=prompt.truncate_head)
        if row.mask_pos is None:
            raise UserError(f"{split.source}, row {i}: the template's *mask* falls beyond max_length={max_length} "
                            f"tokens; keep it in with objective.first_sent_limit=N (tokens of sentence 0; LM-BFF's RTE: "
                            f"240 at 256) or a larger train.max_length")
        cache[i] = (row.input_ids, [0] * len(row.input_ids))
    return Encoded([cache[i][0] for i in indices], [cache[i][1] for i in indices], split.labels[indices])


def collate_group(sets: list[Encoded], rows: list[list[int]], pad_id: int, device: torch.device,
                  width: int | None = None) -> dict[str, torch.Tensor]:
    """One batch from several members' rows, member after member: set i's `rows[i]`, every member the same number.

    Padded to the longest row among them (dynamic padding), or to `width` (gate_pooling=padded).
    """
    import torch  # here: a sweep's preflight checks its data files (check_task_data) before torch loads

    block, labels = collate_host(sets, rows, pad_id, width)
    block, labels = torch.from_numpy(block), torch.from_numpy(labels)
    if device.type == "cuda":  # asynchronous copies: the step does not wait for the work queued before it
        block, labels = block.pin_memory(), labels.pin_memory()
    input_ids, attention_mask, token_type_ids = block.to(device, non_blocking=True).unbind(0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
            "labels": labels.to(device, non_blocking=True)}


def collate_host(sets: list[Encoded], rows: list[list[int]], pad_id: int,
                 width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`collate_group`'s batch on the host: (3, rows, width) int64 (input ids, attention mask, token types: one copy
    to the device), and the labels."""
    lengths = [len(s.input_ids[r]) for s, chosen in zip(sets, rows) for r in chosen]
    width = max(lengths) if width is None else width
    block = np.zeros((3, len(lengths), width), dtype=np.int64)
    input_ids, attention_mask, token_type_ids = block
    input_ids[:] = pad_id
    labels = []
    n = 0
    for encoded, chosen in zip(sets, rows):
        for r in chosen:
            length = len(encoded.input_ids[r])
            input_ids[n, :length] = encoded.input_ids[r]
            token_type_ids[n, :length] = encoded.token_type_ids[r]
            attention_mask[n, :length] = 1
            n += 1
        labels.append(encoded.labels[list(chosen)])
    return block, np.concatenate(labels)
