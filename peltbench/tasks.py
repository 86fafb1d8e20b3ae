"""A task as its config file describes it (`conf/task/*.yaml`, or a user's own task file), in a typed, hashable form.

Every task, the 8 GLUE ones included, is a sentence or sentence-pair classification or regression set: its text
column(s), its label column, its classes (or a score), its metrics, and where its rows are: a `datasets` dataset (the
Hub or its local cache) and/or local files (CSV, TSV, JSON Lines, Parquet). docs/tasks.md describes every key.
Only omegaconf here: `peltbench` checks a task file before torch loads (peltbench.config.check_task).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

# The metrics a task may name (peltbench.metrics computes them, ×100): accuracy, F1 of class 1 (binary), macro F1,
# Matthews correlation, and for a regression task Pearson's and Spearman's correlations.
METRICS = ("accuracy", "f1", "f1_macro", "mcc", "pearson", "spearman")
REGRESSION_METRICS = ("pearson", "spearman")
FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
TASK_KEYS = ("name", "text", "label", "num_labels", "label_names", "label_range", "metrics", "main_metric",
             "max_length", "lmbff_chained", "lmbff_threshold", "dataset", "files", "cloze")
# A task's prompt for objective=cloze (docs/tasks.md): LM-BFF's template and label words, and its sentence limits
CLOZE_KEYS = ("template", "label_words", "first_sent_limit", "other_sent_limit", "num_sample", "double_demo")
DATASET_KEYS = ("path", "name", "train", "test")
FILES_KEYS = ("train", "test", "format", "header", "text", "label")
# What of a task decides its numbers besides its rows (record.semantic_config): a task file whose values of these
# are a packaged task's is that task, identified by its name alone (the GLUE tasks' records keep their hash).
RESULT_KEYS = ("text", "label", "num_labels", "label_names", "label_range", "metrics", "lmbff_chained",
               "lmbff_threshold", "dataset", "files")


@dataclass(frozen=True)
class Files:
    """One layout of local files: the train pool's and the test set's paths (globs allowed; relative to data.dir, or
    where that is null to the directory peltbench starts in), their format, and the columns where they differ from
    the task's."""

    train: str
    test: str
    format: str | None            # tsv, csv, json, parquet; None: from the file's extension
    header: bool                  # CSV, TSV: a header line names the columns (false: columns are 0-based indices)
    text: tuple[str | int, ...]
    label: str | int


@dataclass(frozen=True)
class Dataset:
    """A `datasets` dataset: load_dataset(path, name, split=train / test), from the Hub or the local cache."""

    path: str
    name: str | None
    train: str
    test: str


@dataclass(frozen=True)
class TaskSpec:
    name: str
    num_labels: int               # 1 means regression (STS-B): one output, MSE loss
    metrics: tuple[str, ...]
    main_metric: str
    text: tuple[str | int, ...]   # one text column, or a sentence pair
    label: str | int
    label_names: tuple[str, ...] | None    # the classes' names in the order of their ids (a label is a name or an id)
    label_range: tuple[float, float] | None  # a regression task's valid scores (STS-B: 0 to 5)
    dataset: Dataset | None       # where the rows are with data.dir=null
    files: tuple[Files, ...]      # where they are with data.dir=DIR (or without a dataset): the first layout found
    lmbff_chained: bool = False   # protocol=lmbff: LM-BFF's script shuffles this train file in place, seed after seed
    lmbff_threshold: float | None = None   # protocol=lmbff on a regression task: scores below it are one class

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @classmethod
    def from_config(cls, task: DictConfig) -> TaskSpec:
        node = OmegaConf.to_container(task, resolve=True) if isinstance(task, DictConfig) else task
        node = current_form(node)
        text, label = tuple(node["text"]), node["label"]
        dataset = node.get("dataset")
        names, bounds = node.get("label_names"), node.get("label_range")
        return cls(
            name=node["name"],
            num_labels=int(node["num_labels"]),
            metrics=tuple(node["metrics"]),
            main_metric=node["main_metric"],
            text=text,
            label=label,
            label_names=tuple(label_name(name) for name in names) if names else None,
            label_range=(float(bounds[0]), float(bounds[1])) if bounds else None,
            dataset=None if not dataset else Dataset(path=dataset["path"], name=dataset.get("name"),
                                                     train=dataset.get("train", "train"), test=dataset["test"]),
            files=tuple(Files(train=str(layout["train"]), test=str(layout["test"]), format=layout.get("format"),
                              header=bool(layout.get("header", True)), text=tuple(layout.get("text") or text),
                              label=layout.get("label", label))
                        for layout in files_layouts(node.get("files"))),
            lmbff_chained=bool(node.get("lmbff_chained", False)),
            lmbff_threshold=None if node.get("lmbff_threshold") is None else float(node["lmbff_threshold"]),
        )


def current_form(node: dict) -> dict:
    """A task node as this version's task files write it. A record from before task files took this form (a GLUE task
    with `hub` and `tsv` sections: peltbench.load_run rebuilding a saved run) holds a packaged task: that task file's,
    with the record's own main metric (LM-BFF's STS-B: Pearson)."""
    if not ("hub" in node and "tsv" in node):
        return node
    from .packaged import packaged_config

    packaged = packaged_config(f"task/{node['name']}.yaml")
    if packaged is None:
        raise ValueError(f"task {node['name']}: a task of an earlier peltbench that this version does not ship")
    return {**OmegaConf.to_container(packaged, resolve=True), "main_metric": node["main_metric"]}


def files_layouts(files) -> list:
    """A task's `files`: one layout (a mapping) or a list of them, as a list."""
    if files is None:
        return []
    return [files] if hasattr(files, "keys") else list(files)


def label_name(value) -> str:
    """A class name as a label in a file is compared with it: text; YAML's and JSON's true/false as `true`/`false`."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def file_format(layout: Files, path: str) -> str | None:
    """The format a layout's file is read in: its `format`, else its extension's (None: an extension not known)."""
    if layout.format is not None:
        return layout.format
    lower = path.lower()
    return next((kind for suffix, kind in FORMATS.items() if lower.endswith(suffix)), None)
