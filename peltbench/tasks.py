"""A GLUE task as its config file describes it (`conf/task/*.yaml`), in a typed, hashable form."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class TsvLayout:
    """Where a task lives in the classic `glue_data/<Folder>/` layout, and which columns hold what."""

    folder: str
    test_file: str
    header: bool
    text: tuple[str | int, ...]   # column names (header) or 0-based indices (no header)
    label: str | int
    label_names: tuple[str, ...] | None   # string labels, in the order of the Hub's label ids


@dataclass(frozen=True)
class TaskSpec:
    name: str
    num_labels: int               # 1 means regression (STS-B): one output, MSE loss
    metrics: tuple[str, ...]
    main_metric: str
    hub_config: str               # nyu-mll/glue config name, also the folder of the parquet layout
    hub_text: tuple[str, ...]
    test_split: str               # Hub split name of the official dev set, our test set (§4.1)
    tsv: TsvLayout

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @classmethod
    def from_config(cls, task: DictConfig) -> TaskSpec:
        tsv = OmegaConf.to_container(task.tsv, resolve=True)
        names = tsv["label_names"]
        return cls(
            name=task.name,
            num_labels=int(task.num_labels),
            metrics=tuple(task.metrics),
            main_metric=task.main_metric,
            hub_config=task.hub.config,
            hub_text=tuple(task.hub.text),
            test_split=task.hub.test_split,
            tsv=TsvLayout(
                folder=tsv["folder"], test_file=tsv["test_file"], header=bool(tsv["header"]),
                text=tuple(tsv["text"]), label=tsv["label"], label_names=tuple(names) if names else None,
            ),
        )
