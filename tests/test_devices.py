"""A GPU's faults, caught on a CPU: every method alone and one mixed fused group train, save, reload and export under
bf16 autocast with a GPU's batch shapes, and what peltbench creates stays on the model's device.

On a CUDA GPU `precision=auto` is bf16 autocast and a fused group's members share one pass; on the CPU that runs the
test suite, fp32 and a few members per pass. The `as_on_a_gpu` fixture gives a CPU run the GPU's path: bf16 autocast
(a way in for tests only: `precision=bf16` on a CPU stays refused for users, config.CPU_BF16), every member in one
pass (runner.group_settings' CUDA shapes), and `DeviceCheck` (peltbench/devicecheck.py), which fails what would mix the
CPU and the GPU there. Under `make check-gpu` (PELTBENCH_TEST_DEVICE=cuda) the same tests run on the GPU itself, and
each says where its runs trained (PELTBENCH_DEVICE_REPORT: scripts/check_gpu.py requires them all on CUDA).

Every method keeps its own row: some faults lie on a path only one method takes (a gated method's evaluation mask,
P-tuning v2's position ids), and a group out of the runner's layout order takes the attention's other path (its
prefix classes gathered by index: before issue 48 no device test reached methods/attention.py's _indices). That the
net catches a host tensor left in each of peltbench's paths: tests/test_devicecheck.py.

What these tests caught on main at 50c7a30 (issue 31): the mixed fused group failed in bf16 (`index_add_(): self
(Float) and source (BFloat16)`, methods/base.py add_rows), and AdaLoRA alone and fused (its budget's kept masks stayed
on the CPU: methods/adalora_budget.py).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

import peltbench
import peltbench.runner as runner
from conftest import ENCODERS, TEST_DEVICE, compose_config, save_tiny_encoder, tiny_method_overrides, tiny_run_overrides
from peltbench.devicecheck import MODEL_DEVICE, DeviceCheck
from peltbench.packaged import packaged_config

METHODS = sorted(path.stem for path in (Path(__file__).resolve().parents[1] / "conf" / "method").glob("*.yaml"))
# Prompt tuning fuses only with prompt runs of its length, fine-tuning with nothing: the group has every other method.
GROUP = [method for method in METHODS if method not in ("ft", "prompt")]


# A file each test here appends the device its runs used to: every test of this file takes as_on_a_gpu, and
# scripts/check_gpu.py requires each one's line to say cuda.
REPORT = os.environ.get("PELTBENCH_DEVICE_REPORT")


def gpu_path(monkeypatch) -> list[str]:
    """The GPU's path on this machine (module docstring) but the DeviceCheck, the runs on the model's device as the
    DeviceCheck names it (MODEL_DEVICE, `cpu:0`: "cpu" is the host); returns the list that collects the device type of
    each run (and reload) the test resolves."""
    if TEST_DEVICE is None:
        settings = runner.group_settings
        monkeypatch.setattr(runner, "resolve_device", lambda cfg, training=True: (MODEL_DEVICE, True))
        monkeypatch.setattr(runner, "group_settings",
                            lambda *args, shapes_for=None, **kwargs: settings(*args, shapes_for="cuda", **kwargs))
    resolve, devices = runner.resolve_device, []

    def resolved(cfg, training=True):
        device, bf16 = resolve(cfg, training)
        devices.append(device.type)
        return device, bf16

    monkeypatch.setattr(runner, "resolve_device", resolved)
    return devices


@pytest.fixture
def as_on_a_gpu(monkeypatch, request):
    """The GPU's path on this machine (module docstring); yields the DeviceCheck, which must have seen no fault."""
    devices = gpu_path(monkeypatch)
    with DeviceCheck() as check:
        yield check
    assert check.faults == []  # also none that some code caught and turned into something else
    if REPORT:
        with open(REPORT, "a") as report:
            report.write(f"{request.node.nodeid}\t{','.join(sorted(set(devices))) or 'no run'}\n")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("device-encoders")
    return {model_type: save_tiny_encoder(model_type, root / model_type) for model_type in ENCODERS}


def overrides(method: str, checkpoint: Path, glue: Path, results: Path) -> list[str]:
    # 3 epochs of one step each: AdaLoRA masks to its budget within them (t_i = 0, T − t_f = 1)
    return [f"method={method}", "task=rte", *tiny_run_overrides(checkpoint, glue, results), "train.epochs=3",
            "train.patience=3", "precision=auto", *tiny_method_overrides(method)]


def trained(outcome) -> dict:
    record = outcome.record or {}
    assert outcome.status == "ok", record.get("error") or outcome.error
    assert record["precision"] == "bf16" and math.isfinite(record["test"]["main"])
    return record


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_saves_and_reloads_alone_in_bf16(method, checkpoints, glue_dir, tmp_path, as_on_a_gpu):
    """Trained with its weights and (where PEFT has the method) its PEFT copy saved; reloaded, it scores its test rows
    again on the model's device as the run did."""
    cfg = compose_config(*overrides(method, checkpoints["bert"], glue_dir, tmp_path), "save.weights=true")
    [outcome] = runner.run_group([cfg])
    record = trained(outcome)
    [run_dir] = [path.parent for path in tmp_path.rglob("result.json")]
    loaded = peltbench.load_run(run_dir)
    assert loaded.bf16 and next(loaded.model.parameters()).device.type == loaded.device.type
    assert loaded.predict()[0] == pytest.approx(record["test"], abs=1e-6)


# On a CPU the bf16 group of RoBERTa and ELECTRA (their rows, attention and head sit where BERT's do: the architecture
# map's entries differ in names and RoBERTa's position offset) runs in `make test-slow`, not `make test` (2 x 28 s of
# its 10 minutes); on a GPU (`make check-gpu`, PELTBENCH_TEST_DEVICE set) every encoder's runs.
ON_CPU_SLOW = ("roberta", "electra")


@pytest.mark.parametrize("model_type", [pytest.param(model_type, marks=pytest.mark.slow)
                                        if TEST_DEVICE is None and model_type in ON_CPU_SLOW else model_type
                                        for model_type in ENCODERS])
def test_a_group_of_every_method_trains_fused_in_bf16(model_type, checkpoints, glue_dir, tmp_path, as_on_a_gpu):
    """Every component in one fused group (members using a component sit apart from each other: the rows a component
    adds to are not one span), on every encoder."""
    components = {c for name in GROUP for c in packaged_config(f"method/{name}.yaml").components}
    assert components >= {"adapter", "prefix", "lora", "bitfit", "ln", "parallel_adapter", "dora", "vera", "adalora",
                          "oft", "hra", "boft", "ia3"}
    cfgs = [compose_config(*overrides(method, checkpoints[model_type], glue_dir, tmp_path), "fuse=true")
            for method in GROUP]
    outcomes = runner.run_group(cfgs)
    for outcome in outcomes:
        assert trained(outcome)["fused"]["size"] == len(GROUP)


# A group the runner would seat otherwise (methods.layout_key puts each prefix length in one ascending slice of the
# rows): prefix lengths 10, 0, 8, 10 (gated), so the attention gathers a class by index and puts the rows back. On the
# encoders whose attention hands it more than the rows' mask: DeBERTa's relative bias, ModernBERT's sliding windows.
UNSORTED = ["prefix", "bitfit", "mam", "unipelt_ap"]


@pytest.mark.parametrize("model_type", ["deberta-v2", "modernbert"])
def test_a_group_out_of_layout_order_trains_fused_in_bf16(model_type, checkpoints, glue_dir, tmp_path, monkeypatch,
                                                          as_on_a_gpu):
    """build_pelt_model seats members in the order it is given (the runner and scripts/benchmark_fused.py sort them
    first): in this one, prefix classes are a gathered set of members or a slice out of order (methods/attention.py:
    the rows' order put back by _indices, each member's dropout rows by _rows)."""
    import peltbench.methods.attention as attention

    monkeypatch.setattr(runner, "layout_key", lambda method: 0)  # a stable sort: the group keeps UNSORTED's order
    kinds, indices = set(), attention._indices

    def seen(positions, device):
        kinds.add(type(positions).__name__)
        return indices(positions, device)

    monkeypatch.setattr(attention, "_indices", seen)
    cfgs = [compose_config(*overrides(method, checkpoints[model_type], glue_dir, tmp_path), "fuse=true")
            for method in UNSORTED]
    for outcome in runner.run_group(cfgs):
        assert trained(outcome)["fused"]["size"] == len(UNSORTED)
    assert kinds == {"slice", "Tensor"}
