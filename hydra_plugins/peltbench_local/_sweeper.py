"""The sweeper of `peltbench -m`: Hydra's basic sweeper (the same grid, order and batches), without composing every
run again when peltbench has just composed and checked them all.

Before each batch Hydra's BasicSweeper composes each of its jobs from the config files to catch a composition error
early (`validate_batch_is_legal`): about 0.1 s a run, 100 s for a batch of 1,000, hours for 100,000 runs. `peltbench
-m ...` has composed and checked every run of the sweep before Hydra starts (peltbench.cli.preflight, the way
peltbench-missing composes them, whose equality with Hydra's own composition tests/test_missing.py holds), so for the
sweep that preflight checked the batch is not composed again. Any other sweep (Hydra's own flags -cp, -cd,
--experimental-rerun skip preflight) is checked by Hydra, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig


@dataclass
class PeltbenchSweeperConf:
    _target_: str = "hydra_plugins.peltbench_local._sweeper.PeltbenchSweeper"
    max_batch_size: Optional[int] = None  # as BasicSweeperConf
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="peltbench", node=PeltbenchSweeperConf, provider="peltbench")


class PeltbenchSweeper(Sweeper):
    """Hydra's BasicSweeper does the sweep; this only decides whether it composes each batch again. It holds one
    rather than extending it: Hydra's plugin scan executes its module again, and BasicSweeper.__init__'s
    `super(BasicSweeper, self)` then names a class a subclass made before the scan is not one of."""

    def __init__(self, max_batch_size: Optional[int], params: Optional[Dict[str, str]] = None) -> None:
        self.max_batch_size, self.params = max_batch_size, params
        self.basic: Any = None
        self.config: Optional[DictConfig] = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        self.config = config
        self.basic = BasicSweeper(self.max_batch_size, self.params)
        self.basic.validate_batch_is_legal = self.validate_batch_is_legal  # called by its sweep() before each batch
        self.basic.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.basic.sweep(arguments)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        from peltbench.cli import checked_sweep, sweep_overrides

        assert self.config is not None
        if checked_sweep() != sweep_overrides(self.config):  # not the sweep preflight checked
            BasicSweeper.validate_batch_is_legal(self.basic, batch)
