"""docs/components.md's code runs (issue 58: its declaration example raised NameError when imported): every python block
of the page executes on its own, and its complete component, saved as a user's module, trains fused as it does alone."""

from __future__ import annotations

import re
import sys

import pytest
from omegaconf import OmegaConf

from conftest import REPO, assert_trained_alike, compose_config, tiny_run_overrides

PAGE = REPO / "docs" / "components.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)


def test_the_page_has_its_examples():
    assert len(BLOCKS) >= 2 and any("def install(" in block for block in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_python_block_runs_on_its_own(index):
    """Each block as a module of its own would run: its imports are there, every name it uses is defined; a block that
    declares a COMPONENT has one peltbench reads from its source without running it, equal to the one it makes."""
    from peltbench.component import read_declaration

    source = BLOCKS[index]
    namespace = {"__name__": f"components_doc_block_{index}"}
    exec(compile(source, f"{PAGE}, python block {index + 1}", "exec"), namespace)  # noqa: S102 - the page's own code
    if "COMPONENT" in namespace:
        assert read_declaration(source, str(PAGE), "mylab.example") == namespace["COMPONENT"]


@pytest.fixture
def low_rank(tmp_path, monkeypatch):
    """The page's complete component saved as the user's `mylab.low_rank` (forgotten after the test)."""
    from peltbench import component

    [source] = [block for block in BLOCKS if "def install(" in block]
    (tmp_path / "code" / "mylab").mkdir(parents=True)
    (tmp_path / "code" / "mylab" / "__init__.py").write_text("")
    (tmp_path / "code" / "mylab" / "low_rank.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    component.declaration.cache_clear()
    yield "mylab.low_rank"
    for name in [name for name in sys.modules if name.split(".")[0] == "mylab"]:
        del sys.modules[name]
    component.declaration.cache_clear()
    component.code_identity.cache_clear()


def test_its_complete_component_trains_fused_as_alone(low_rank, tmp_path, tiny_checkpoint, glue_dir):
    """Two members of different ranks (4 and 2, other seeds) in one group, dropout on: each record is its run
    alone's."""
    from peltbench.runner import run_group

    def run(rank: int, seed: int, folder: str, fuse: bool):
        cfg = compose_config("method=lora", "task=rte", f"seed={seed}", f"fuse={str(fuse).lower()}",
                             *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path / folder))
        cfg.method = OmegaConf.create({"name": "low_rank", "components": [low_rank], "low_rank": rank,
                                       "low_rank_targets": ["query", "value"], "head": "frozen", "lr": 5e-3})
        return cfg

    alone = [run_group([run(rank, seed, "alone", False)])[0] for rank, seed in ((4, 111), (2, 222))]
    fused = run_group([run(rank, seed, "fused", True) for rank, seed in ((4, 111), (2, 222))])
    for by_itself, together in zip(alone, fused):
        assert by_itself.status == together.status == "ok", (by_itself.error, together.error)
        assert together.record["fused"]["size"] == 2
        assert_trained_alike(by_itself.record, together.record)
    ranks = [outcome.record["trainable_params"] for outcome in alone]
    assert ranks == [2 * 2 * 4 * (32 + 32), 2 * 2 * 2 * (32 + 32)]  # q and v of 2 layers, A and B of width 32
