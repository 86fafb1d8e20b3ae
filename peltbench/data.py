"""GLUE data: load a split (Hub, glue_data TSV or parquet), the seeded few-shot split, tokenisation, batches.

The few-shot protocol (UniPELT App. B, docs/protocol.md): perm = numpy.random.default_rng(seed).permutation(n),
train = perm[:K], dev = perm[K:K + 1000], test = the official GLUE dev split (MNLI: matched). Other protocols
(docs/protocol.md §10): LM-BFF's K per class (`lmbff_split`) and GLUE dev in two parts (`dev_halves`).
"""

from __future__ import annotations

import csv
import functools
import glob
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import UserError
from .hub import use_hub
from .progress import progress
from .protocols import LMBFF_SEED_ORDER, lmbff_chain  # noqa: F401  (re-exported: the split's definition)
from .tasks import TaskSpec

HUB_DATASET = "nyu-mll/glue"


@dataclass(eq=False)
class Split:
    """The rows of one split: one or two text columns and the labels (int ids, or floats for STS-B)."""

    texts: tuple[list[str], ...]
    labels: np.ndarray
    source: str
    encodings: dict = field(default_factory=dict)  # (tokenizer, max_length) → {row: (input_ids, token_type_ids)}

    def __len__(self) -> int:
        return len(self.labels)


# ---------------------------------------------------------------- loading

@functools.lru_cache(maxsize=32)
def load_split(task: TaskSpec, data_dir: str | None, split: str) -> Split:
    """`split` is "train" or "test". Cached per process, so a local sweep reads each file once."""
    if data_dir is None:
        return _load_hub(task, split)
    layout, folder = _task_folder(task, data_dir)
    if layout == "tsv":
        return read_tsv(folder / ("train.tsv" if split == "train" else task.tsv.test_file), task)
    return _load_parquet(folder, task, split)


def check_task_data(task: TaskSpec, data_dir: str) -> None:
    """That the local GLUE directory `data_dir` has the task's train and test files (their names only: a run reads
    and checks their rows), as load_split will look for them; else a UserError naming the task, the folder and how
    to get it. A sweep calls it for each task before its first run starts (peltbench.cli.preflight), torch unloaded."""
    layout, folder = _task_folder(task, data_dir)
    for split in ("train", "test"):
        if layout == "tsv":
            path = folder / ("train.tsv" if split == "train" else task.tsv.test_file)
            found = path.is_file()
        else:
            path = folder / f"{_hub_split_name(task, split)}-*.parquet"
            found = bool(glob.glob(str(path)))
        if not found:
            raise UserError(f"task={task.name}: data file not found: {path}")


# How to get a task a local GLUE directory lacks (data/glue/README.md: MRPC and STS-B are not shipped, for their terms)
GET_DATA = ("peltbench ships only CoLA, SST-2 and RTE (data/glue): for other tasks point data.dir at a GLUE download "
            "(README, Offline use) or leave it unset (the Hub)")


def _task_folder(task: TaskSpec, data_dir: str) -> tuple[str, Path]:
    """("tsv" or "parquet", the task's folder) in a local GLUE directory; a UserError if it has no such folder."""
    root = Path(data_dir).expanduser().absolute()
    if not root.is_dir():
        raise UserError(f"data.dir={data_dir}: no such directory")
    if (root / task.tsv.folder).is_dir():
        return "tsv", root / task.tsv.folder
    if (root / task.hub_config).is_dir():
        _refuse_tsv_in_parquet_folder(root, task)
        return "parquet", root / task.hub_config
    near = sorted(entry.name for entry in root.iterdir() if entry.is_dir()
                  and entry.name.lower() in (task.tsv.folder.lower(), task.hub_config.lower()))
    found = f"; found {near[0]}/: rename it (the folder names are case-sensitive)" if near else f"; {GET_DATA}"
    raise UserError(
        f"no {task.name} data under {root}: expected {root / task.tsv.folder}/ (glue_data TSV layout) "
        f"or {root / task.hub_config}/ (parquet layout of `hf download {HUB_DATASET}`){found}"
    )


def _refuse_tsv_in_parquet_folder(root: Path, task: TaskSpec) -> None:
    """TSV files in the parquet layout's lowercase folder (`rte/train.tsv`): glue_data's folder is `RTE/`."""
    folder = root / task.hub_config
    if not list(folder.glob("*.parquet")) and list(folder.glob("*.tsv")):
        raise UserError(f"{folder}/ holds TSV files, but the glue_data TSV layout names that folder "
                        f"{task.tsv.folder}/: rename it to {root / task.tsv.folder}/ (a folder {task.hub_config}/ "
                        f"is read as the parquet layout)")


def _hub_split_name(task: TaskSpec, split: str) -> str:
    return "train" if split == "train" else task.test_split


def _load_hub(task: TaskSpec, split: str) -> Split:
    import datasets

    use_hub()  # fails fast without a network
    name = _hub_split_name(task, split)
    try:
        rows = datasets.load_dataset(HUB_DATASET, task.hub_config, split=name)
    except Exception as error:  # network, offline mode, missing cache: all end the same way for the user
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(
            f"could not load {HUB_DATASET}/{task.hub_config} ({name}) from the Hugging Face Hub: {first_line}. "
            f"Offline? Point data.dir at a local GLUE directory (README: Offline use)."
        ) from error
    texts = tuple(list(rows[column]) for column in task.hub_text)
    labels = _label_array(rows["label"], task, lambda row: f"{HUB_DATASET}/{task.hub_config} ({name} split), row index {row}")
    return Split(texts, labels, f"hub:{HUB_DATASET}/{task.hub_config}/{name}")


def _load_parquet(folder: Path, task: TaskSpec, split: str) -> Split:
    import pandas as pd

    name = _hub_split_name(task, split)
    files = sorted(glob.glob(str(folder / f"{name}-*.parquet")))
    if not files:
        raise UserError(f"data file not found: {folder}/{name}-*.parquet")
    frames = [_read_parquet(Path(file), task) for file in files]
    rows = pd.concat(frames, ignore_index=True)
    if rows.empty:
        raise UserError(f"{folder}/{name}-*.parquet: no data rows")
    texts = tuple(rows[c].astype(str).tolist() for c in task.hub_text)
    labels = np.concatenate([_label_array(frame["label"].tolist(), task, lambda row, file=file: f"{file}, row index {row}")
                             for frame, file in zip(frames, files)])
    return Split(texts, labels, f"parquet:{folder}")


def _read_parquet(file: Path, task: TaskSpec):
    import pandas as pd

    try:
        frame = pd.read_parquet(file)
    except Exception as error:  # pyarrow's errors for a truncated or foreign file
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"{file}: not a readable parquet file ({first_line})") from None
    missing = [c for c in (*task.hub_text, "label") if c not in frame.columns]
    if missing:
        raise UserError(f"{file}: missing column(s) {missing}")
    return frame


def read_tsv(path: Path, task: TaskSpec) -> Split:
    """Read a glue_data TSV with quoting off (GLUE text has bare quotes); a malformed row is an error."""
    if not path.is_file():
        raise UserError(f"data file not found: {path}")
    layout = task.tsv
    rows = list(csv.reader(io.StringIO(_utf8_text(path), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
    start = 1 if layout.header else 0
    columns = _column_indices(path, rows[0] if rows else [], task)
    width = len(rows[0]) if rows else 0  # every row has as many fields as the first (header or data)
    texts: tuple[list[str], ...] = tuple([] for _ in layout.text)
    labels, lines = [], []
    for line, row in enumerate(rows[start:], start=start + 1):
        if not row:
            continue
        if len(row) != width or len(row) <= max(columns):
            raise UserError(f"malformed row in {path}, line {line}: expected {width} tab-separated fields, found {len(row)}")
        for column, out in zip(columns[:-1], texts):
            out.append(row[column])
        labels.append(_parse_label(row[columns[-1]], task, path, line))
        lines.append(line)
    if not labels:
        raise UserError(f"{path}: no data rows" + (" (only a header)" if rows and layout.header else ""))
    labels = _label_array(labels, task, lambda row: f"malformed row in {path}, line {lines[row]}")
    return Split(texts, labels, f"tsv:{path.parent}")


def _utf8_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise UserError(f"{path}: not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}); "
                        f"GLUE files are UTF-8") from None


def _column_indices(path: Path, header: list[str], task: TaskSpec) -> list[int]:
    """Indices of the text columns, then the label column."""
    wanted = [*task.tsv.text, task.tsv.label]
    if not task.tsv.header:
        return [int(c) for c in wanted]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise UserError(f"{path}: header lacks column(s) {missing} (found {header})")
    return [header.index(c) for c in wanted]


def _parse_label(value: str, task: TaskSpec, path: Path, line: int) -> float | int:
    try:
        if task.tsv.label_names is not None:
            return task.tsv.label_names.index(value)
        return float(value) if task.is_regression else int(value)
    except ValueError:
        raise UserError(f"malformed row in {path}, line {line}: label {value!r} is not valid for {task.name}") from None


# STS-B's similarity scores run from 0 to 5 (GLUE); a class label runs from 0 to num_labels - 1.
REGRESSION_RANGE = {"stsb": (0.0, 5.0)}


def _label_array(labels, task: TaskSpec, where) -> np.ndarray:
    """The labels as an array, every one checked at once (QQP has 364k): NaN, infinite or out of range is a
    UserError naming the row, `where(row)` (a file and line, or a file or split and row index)."""
    labels = list(labels)
    try:
        values = np.asarray(labels, dtype=np.float64)  # None becomes NaN, refused below
    except (TypeError, ValueError):
        values = np.array([v if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan for v in labels])
    if task.is_regression:
        low, high = REGRESSION_RANGE.get(task.name, (-math.inf, math.inf))
        bad = (values < low) | (values > high)
    else:
        low, high = 0, task.num_labels - 1
        bad = (values < low) | (values > high) | (np.mod(values, 1) != 0)
    bad |= ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        problem = "not a finite number" if not np.isfinite(values[row]) else f"valid: {low:g} to {high:g}"
        hint = ", an unlabelled test split?" if values[row] == -1 else ""
        raise UserError(f"{where(row)}: label {labels[row]!r} is not valid for {task.name} ({problem}{hint})")
    return values.astype(np.float32 if task.is_regression else np.int64)


# ---------------------------------------------------------------- the few-shot split

def few_shot_split(num_train: int, k: int, seed: int, dev_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and dev row indices (App. B): the same permutation `datasets.Dataset.shuffle(seed=seed)` makes."""
    if k + dev_size > num_train:
        raise UserError(
            f"k={k} is too large: the train split has {num_train} rows and k + dev_size ({k} + {dev_size}) "
            f"must not exceed it"
        )
    permutation = np.random.default_rng(seed).permutation(num_train)
    return permutation[:k], permutation[k : k + dev_size]


# LM-BFF's tools/generate_k_shot_data.py groups STS-B by `0 if float(line[-1]) < 2.5 else 1` (for sampling only).
STSB_CLASS_THRESHOLD = 2.5


def lmbff_split(labels: np.ndarray, k: int, seed: int, regression: bool = False,
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
    rows' labels in file order (STS-B: scores, classed at 2.5). `chain`: the seeds whose shuffles came first, in order
    (lmbff_chain: CoLA's in-place shuffles). A class with fewer than 2K rows is refused: the script would silently
    write a smaller dev set.
    """
    order = list(range(len(labels)))
    for earlier in (*chain, seed):
        np.random.RandomState(earlier).shuffle(order)  # = np.random.seed(seed); np.random.shuffle(train_lines)
    classes = (labels >= STSB_CLASS_THRESHOLD).astype(np.int64) if regression else labels
    groups: dict = {}
    for row in order:
        groups.setdefault(classes[row].item(), []).append(row)
    short = [label for label, rows in groups.items() if len(rows) < 2 * k]
    if short:
        raise UserError(f"k={k}: LM-BFF's split takes 2K = {2 * k} train rows of each class (K train, K dev), and "
                        f"class {short[0]} has {len(groups[short[0]])}")
    train = [row for rows in groups.values() for row in rows[:k]]
    dev = [row for rows in groups.values() for row in rows[k : 2 * k]]
    return np.array(train, dtype=np.int64), np.array(dev, dtype=np.int64)


def dev_halves(num_rows: int, seed: int, where: str = "GLUE dev") -> tuple[np.ndarray, np.ndarray]:
    """GLUE dev in two parts, (selection rows, test rows), as ReFT's pyreft examples/loreft/train.py sizes them:
    1,000 rows select when GLUE dev has over 5,000, else n // 2; the rest is reported. The rows are a permutation
    of GLUE dev from the data seed (pyreft's torch.utils.data.random_split draws from torch's global generator
    after its model is built: not reproducible outside it). Each part sorted, in the official dev order.
    Fewer than 2 rows (a part would be empty) is a UserError naming `where`, the split."""
    if num_rows < 2:
        raise UserError(f"{where} has {num_rows} row{'s' if num_rows != 1 else ''}: protocol full_halves splits it in "
                        f"two (one part selects the epoch, the other is reported), so it needs at least 2")
    selection = 1000 if num_rows > 5000 else num_rows // 2
    permutation = np.random.default_rng(seed).permutation(num_rows)
    return np.sort(permutation[num_rows - selection :]), np.sort(permutation[: num_rows - selection])


# ---------------------------------------------------------------- tokenisation and batches

@dataclass
class Encoded:
    """Tokenised rows of one subset, with labels, ready to batch."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def encode(split: Split, indices, tokenizer, max_length: int) -> Encoded:
    """Tokenise the given rows, each row once per process and tokenizer (a sweep reuses them)."""
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
