"""Fused training: a member of a group computes exactly what its separate run computes (dropout off).

Tolerances: the group's forward and gradients equal the separate model's to 1e-5 (relative) / 1e-6
(absolute); on this CPU they come out bit-identical, but a batched matmul over more rows may sum in another
order on other hardware. Losses, dev curves and scores of whole runs are compared to 1e-6.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import (TINY, assert_close_to_scale, compose_config, save_tiny_encoder, tiny_backbone,
                      tiny_run_overrides)
from peltbench.data import collate_group
from peltbench.fusion import plan_groups
from peltbench.methods import build_pelt_model, member_state
from peltbench.packaged import packaged_config
from peltbench.record import CLEAR_REFS
from peltbench.runner import run_group
from peltbench.tasks import TaskSpec
from peltbench.train import MemberAdamW, clip_per_member

# Every frozen-backbone method, some with their settings changed so members pad to each other's sizes.
MEMBERS = [
    ("adapter", {}), ("adapter", {"bottleneck": 4, "gated": True}), ("bitfit", {}), ("ln", {}), ("prefix", {}),
    ("prefix_l50", {}), ("lora", {}), ("lora", {"lora_rank": 2, "lora_scale": 4.0}), ("unipelt_ap", {}),
    ("unipelt_apl", {}), ("unipelt_ap_nogate", {}), ("unipelt_apl_nogate", {}), ("prefix_ln", {}), ("mam", {}),
    ("mam_he", {"bottleneck": 16, "prefix_length": 3}),
    ("adapter", {"components": ["adapter", "ln", "bitfit"]}),  # its own LayerNorms inside the adapter's rows
    ("dora", {}), ("dora", {"lora_rank": 2, "lora_targets": ["key", "value"]}), ("lora_fa", {}),
    ("vera", {"vera_rank": 16}), ("vera", {"vera_rank": 8, "vera_targets": ["value"], "gated": True}),
    ("unipelt_ap", {"components": ["vera", "prefix", "adapter"], "vera_rank": 8, "vera_targets": ["query", "value"],
                    "vera_d_initial": 0.1}),  # a gated mixture beyond UniPELT
    ("ia3", {}), ("ptuning_v2", {}), ("ptuning_v2", {"prefix_length": 3, "gated": True}),
    ("fourierft", {"fourierft_n_frequency": 100, "fourierft_scaling": 20.0}),
    ("c3a", {"c3a_block_size": 8}), ("c3a", {"c3a_block_size": 16, "c3a_targets": ["key", "value"]}),  # two deltas
    ("road", {}), ("road", {"road_variant": 4, "road_group_size": 8, "road_targets": ["key", "value"]}),
    ("delora", {}), ("delora", {"delora_rank": 3, "delora_targets": ["key", "value"]}),
    ("lora", {"lora_init": "pissa"}), ("dora", {"lora_init": "olora", "lora_rank": 4}),  # frozen A₀, B₀ per member
]


def method(name: str, changes: dict):
    config = OmegaConf.create(OmegaConf.to_container(packaged_config(f"method/{name}.yaml")))
    for key, value in changes.items():
        config[key] = value
    return config


def no_dropout_backbone(num_labels: int = 2):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(num_labels=num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **TINY)
    return BertForSequenceClassification(config)


def member_inputs(seed: int, rows: int = 3):
    generator = torch.Generator().manual_seed(seed)
    length = 5 + seed % 6
    ids = torch.randint(5, 64, (rows, length), generator=generator)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[0, length - 2 :] = 0
    return ids, mask


def test_a_group_computes_each_members_logits_and_gradients():
    """All methods in one group, each member its own rows: logits and gradients equal the separate models'."""
    methods = [method(name, changes) for name, changes in MEMBERS]
    assert_members_compute_as_alone(methods, [42 + i % 3 for i in range(len(methods))])  # other model seeds, too


def test_a_group_of_prompt_runs_computes_each_members_logits_and_gradients():
    """Prompt runs of one length (the only ones that fuse with them), other seeds, inits and components beside the
    prompts: each member's logits and gradients equal its separate model's."""
    members = [method("prompt", {}), method("prompt", {"prompt_init": "random"}),
               method("prompt", {"components": ["prompt", "ia3"]}), method("prompt", {"components": ["prompt", "bitfit"]})]
    assert_members_compute_as_alone(members, [42, 43, 44, 42])


def assert_members_compute_as_alone(methods, seeds) -> None:
    """`methods` with their model `seeds` in one group, each member its own rows of a batch: each member starts as its
    separate model, and its logits and gradients equal that model's (a smaller member's tensors at the start of the
    group's padded ones, no gradient in the padding)."""
    group = build_pelt_model(no_dropout_backbone(), methods, seeds, [no_dropout_backbone()] * len(methods))
    inputs = [member_inputs(i) for i in range(len(methods))]
    width = max(ids.shape[1] for ids, _ in inputs)
    ids = torch.cat([F.pad(ids, (0, width - ids.shape[1])) for ids, _ in inputs])
    mask = torch.cat([F.pad(mask, (0, width - mask.shape[1])) for _, mask in inputs])
    labels = torch.randint(0, 2, (ids.shape[0],), generator=torch.Generator().manual_seed(7))
    logits = group(ids, mask, torch.zeros_like(ids))
    F.cross_entropy(logits, labels, reduction="none").view(len(methods), -1).mean(1).sum().backward()
    gradients = [{group.stored_name(name): p.grad for name, p, flags, _ in group.member_parameters() if flags[slot]}
                 for slot in range(len(methods))]  # a member's names (LoRA's and DoRA's A are both `lora_a`)
    for slot, (config, seed, (member_ids, member_mask)) in enumerate(zip(methods, seeds, inputs)):
        alone = build_pelt_model(no_dropout_backbone(), config, seed)
        alone_logits = alone(member_ids, member_mask, torch.zeros_like(member_ids))
        assert_close_to_scale(logits[3 * slot : 3 * slot + 3], alone_logits)
        F.cross_entropy(alone_logits, labels[3 * slot : 3 * slot + 3]).backward()
        start = member_state(group, slot)
        for name, parameter, _, _ in alone.member_parameters():
            name = alone.stored_name(name)
            own = tuple(slice(0, n) for n in parameter.shape[1:])
            torch.testing.assert_close(start[name][own], parameter[0].detach(), rtol=0, atol=0, msg=f"{slot} {name} init")
            grad = gradients[slot][name][slot]
            assert_close_to_scale(grad[own], parameter.grad[0], msg=f"{slot} {name} grad")
            padding = grad.clone()
            padding[own] = 0
            assert not padding.any(), f"{slot} {name}: a padded slot got a gradient"


def torch_references(group, lrs, totals):
    """Per member: a copy of its trained tensors, torch.optim.AdamW at its lr and the linear schedule over its total
    steps, as MemberAdamW's slice of that member is to follow them."""
    references = []
    for m, (lr, total) in enumerate(zip(lrs, totals)):
        state = {name: tensor.clone().requires_grad_(True) for name, tensor in member_state(group, m).items()}
        torch_optimizer = torch.optim.AdamW(state.values(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(torch_optimizer, lambda s, t=total: max(0.0, (t - s) / t))
        references.append((state, torch_optimizer, schedule))
    return references


def test_member_adamw_and_clipping_equal_torch_per_member():
    """Each member's slice follows torch's AdamW + linear schedule + clip_grad_norm_ with its own lr and norm, bit for
    bit on a CPU."""
    methods = [method("adapter", {}), method("lora", {}), method("adapter", {"bottleneck": 8})]
    group = build_pelt_model(no_dropout_backbone(), methods, 42, [no_dropout_backbone()] * 3)
    optimizer = MemberAdamW(group)  # the adapters' span is every slot, LoRA's masked; LoRA's span is its own slot
    assert {slots for bank in optimizer.banks for slots in bank.slots} == {(0, 3), (1, 2)}
    assert any(bank.untrained_views for bank in optimizer.banks)  # the adapters' slot of the LoRA member
    lrs, totals = [1e-2, 3e-3, 5e-2], [5, 5, 3]
    for m in range(3):
        optimizer.schedule(m, lrs[m], totals[m])
    references = torch_references(group, lrs, totals)
    generator = torch.Generator().manual_seed(0)
    for step in range(4):
        for name, parameter, flags, _ in group.member_parameters():
            parameter.grad = torch.randn(parameter.shape, generator=generator)
            for m, (state, _, _) in enumerate(references):
                if flags[m]:
                    state[group.stored_name(name)].grad = parameter.grad[m].clone()
        clip_per_member(optimizer, torch.tensor([0.5, 1.0, 2.0]))
        optimizer.step(step)
        optimizer.zero_grad()
        for m, (state, torch_optimizer, schedule) in enumerate(references):
            torch.nn.utils.clip_grad_norm_(state.values(), [0.5, 1.0, 2.0][m])
            torch_optimizer.step()
            schedule.step()
            for name, tensor in member_state(group, m).items():
                assert torch.equal(tensor, state[name].detach()), (step, m, name)


@pytest.mark.parametrize("clipped", [False, True])
def test_member_adamw_keeps_a_slot_without_a_gradient_as_torch_does(clipped):
    """A parameter whose .grad is None on a step, and a member that has left the group, keep their moments and step
    count, as torch.optim.AdamW keeps a parameter's that has no gradient; each slot's bias correction follows its own
    count. Every member's weights, moments and step counts equal its own torch.optim.AdamW's bit for bit, unclipped
    and clipped (clip_grad_norm_ per member, its parameters without a gradient left out of its norm); and so on after
    the state is handed over through a checkpoint's save and load (`state` / `restore`)."""
    methods = [method("adapter", {}), method("lora", {}), method("adapter", {"bottleneck": 8})]
    group = build_pelt_model(no_dropout_backbone(), methods, 42, [no_dropout_backbone()] * 3)
    optimizer = MemberAdamW(group)
    lrs, totals, norms = [1e-2, 3e-3, 5e-2], [8, 8, 6], [0.3, 1.0, 2.0] if clipped else [1e9] * 3
    for m in range(3):
        optimizer.schedule(m, lrs[m], totals[m])
    references = torch_references(group, lrs, totals)
    parameters = [(group.stored_name(name), parameter, flags) for name, parameter, flags, _ in group.member_parameters()]
    skipped = {1: set(range(0, len(parameters), 3)), 2: set(range(1, len(parameters), 4)), 4: {2}}
    left = 2  # leaves after step 3: not in the pass from step 4 on (its slots' gradients 0), its optimiser stepped no more
    generator = torch.Generator().manual_seed(0)
    for step in range(7):
        if step == 4:
            optimizer.leave(left)
        training = [m for m in range(3) if step < 4 or m != left]
        for index, (name, parameter, flags) in enumerate(parameters):
            parameter.grad = None if index in skipped.get(step, ()) else torch.randn(parameter.shape, generator=generator)
            for m, (state, _, _) in enumerate(references):
                if parameter.grad is not None and m not in training:
                    parameter.grad[m] = 0
                if flags[m]:
                    state[name].grad = None if parameter.grad is None or m not in training else parameter.grad[m].clone()
        if step == 5:  # a checkpoint: the state handed over to a new optimiser of the same group, as checkpoint.py
            torch.save(optimizer.state(), buffer := io.BytesIO())  # writes and reads it
            optimizer = MemberAdamW(group)
            optimizer.restore(torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu", weights_only=True))
        clip_per_member(optimizer, torch.tensor(norms))
        optimizer.step(step)
        optimizer.zero_grad()
        for m in training:
            state, torch_optimizer, schedule = references[m]
            torch.nn.utils.clip_grad_norm_([p for p in state.values() if p.grad is not None], norms[m])
            torch_optimizer.step()
            schedule.step()
        names = {id(parameter): name for name, parameter, _ in parameters}
        for bank in optimizer.banks:
            for s, (index, m) in enumerate(zip(bank.segment_params, bank.segment_members)):
                if not bank.trained[s]:
                    continue
                state, torch_optimizer, _ = references[m]
                theirs = torch_optimizer.state.get(state[names[id(bank.params[index])]], {})
                assert bank.steps[s] == int(theirs.get("step", 0)), (step, m, names[id(bank.params[index])])
                for key in ("exp_avg", "exp_avg_sq"):
                    ours = getattr(bank, key)[bank.starts[s] : bank.starts[s + 1]]
                    expected = theirs[key].flatten() if theirs else torch.zeros_like(ours)
                    assert torch.equal(ours, expected), (step, m, key)
        for m, (state, _, _) in enumerate(references):
            for name, tensor in member_state(group, m).items():
                assert torch.equal(tensor, state[name].detach()), (step, m, name)


@pytest.fixture(scope="module")
def quiet_checkpoint(tmp_path_factory, tiny_checkpoint) -> Path:
    """The tiny checkpoint with dropout off, so a member's masks cannot differ from its separate run's."""
    folder = tmp_path_factory.mktemp("tiny-bert-no-dropout")
    shutil.copytree(tiny_checkpoint, folder, dirs_exist_ok=True)
    no_dropout_backbone().save_pretrained(folder)
    return folder


def sweep_configs(checkpoint: Path, glue: Path, results: Path, methods, seeds=(111, 222), **extra) -> list:
    overrides = [*tiny_run_overrides(checkpoint, glue, results), "train.epochs=4", "train.patience=2", "fuse=true"]
    overrides += [f"{key}={value}" for key, value in extra.items()]
    return [compose_config(f"method={name}", "task=mrpc", f"seed={seed}", f"method.lr={lr}", *overrides)
            for name, lr in methods for seed in seeds]


RUNS = [("adapter", 1e-2), ("lora", 3e-2), ("prefix", 3e-2), ("unipelt_apl", 1e-2), ("bitfit", 3e-2), ("ln", 3e-2),
        ("mam", 1e-2), ("prefix_ln", 1e-2)]


def test_a_fused_run_ends_as_its_separate_run(quiet_checkpoint, glue_dir, tmp_path):
    """Losses, dev curve, early stopping, test scores and gates of every member equal its separate run."""
    separate = [run_group([cfg])[0] for cfg in sweep_configs(quiet_checkpoint, glue_dir, tmp_path / "separate", RUNS)]
    fused = run_group(sweep_configs(quiet_checkpoint, glue_dir, tmp_path / "fused", RUNS))
    assert len(plan_groups(sweep_configs(quiet_checkpoint, glue_dir, tmp_path / "fused", RUNS))) == 1
    stopped = set()
    # on CUDA the allocator's peak; on the CPU: since the group started, where /proc/self/clear_refs resets it (Linux),
    # else the process's lifetime
    device = fused[0].record["device"]
    cpu_peak = ("cuda_max_memory_allocated" if device.startswith("cuda") else
                "process_peak_rss_since_group_start" if os.access(CLEAR_REFS, os.W_OK) else "process_peak_rss")
    for alone, member in zip(separate, fused):
        a, b = alone.record, member.record
        assert a["status"] == b["status"] == "ok"
        assert a["fused"] is None and b["fused"] == {"group": fused[0].record["fused"]["group"], "size": len(RUNS) * 2}
        assert (a["best_epoch"], a["epochs_run"]) == (b["best_epoch"], b["epochs_run"])
        assert (a["peak_memory"]["of"], b["peak_memory"]["of"]) == ("run", "group")  # the group's peak, said so
        assert a["peak_memory"]["measures"] == b["peak_memory"]["measures"] == cpu_peak  # each group's own
        assert (a["train_seconds_share"], a["eval_seconds_share"]) == (a["train_seconds"], a["eval_seconds"])  # alone
        assert b["train_seconds_share"] < b["train_seconds"]  # fused: its part of its group's seconds
        assert [h["dev_main"] for h in a["history"]] == pytest.approx([h["dev_main"] for h in b["history"]], abs=1e-6)
        assert [h["train_loss"] for h in a["history"]] == pytest.approx([h["train_loss"] for h in b["history"]], rel=1e-6)
        assert a["test"] == pytest.approx(b["test"], abs=1e-6)
        assert a["trainable_params"] == b["trainable_params"] and a["config_hash"] == b["config_hash"]
        if a["gates"] is not None:
            for key in a["gates"]:
                assert a["gates"][key] == pytest.approx(b["gates"][key], abs=1e-6)
        stopped.add(a["epochs_run"])
    assert len({json.dumps(o.record["history"]) for o in fused}) == len(fused)  # the runs did differ


def test_a_member_beside_other_methods_trains_bit_for_bit_as_alone(glue_dir, tmp_path):
    """Members with the same rows (one seed), on a CPU: FourierFT, whose delta is not zero at the start (rounding in
    its spectrum's gradient grows over the steps: 2.2e-5 of its 4th train loss here before Members.funnel), LoRA and
    the rotations of q's and v's input (HRA, OFT; HRA's gradient differed from step 0) train to the same losses, dev
    and test scores in one group as alone, bit for bit: a member's gradient sums the same terms in the same order in
    any group (Members.funnel, Members.gather), and so does its norm for clipping (MemberAdamW.clip). Members with
    other rows pad to other widths, which the backbone's sums round otherwise: equal to rounding
    (test_a_fused_run_ends_as_its_separate_run)."""
    names = ["fourierft", "lora", "hra", "oft"]
    checkpoint = save_tiny_encoder("bert", tmp_path / "bert")  # O(1) weights: attention far from uniform

    def configs(where: str, *extra: str) -> list:
        run = [o for o in tiny_run_overrides(checkpoint, glue_dir, tmp_path / where) if not o.startswith("device=")]
        return [compose_config(f"method={name}", "task=rte", *run, "device=cpu", "train.epochs=4", "method.lr=5e-2",
                               "train.grad_clip=3", *extra) for name in names]
    alone = [run_group([config])[0].record for config in configs("alone")]
    fused = {o.record["config"]["method"]["name"]: o.record for o in run_group(configs("fused", "fuse=true"))}
    for a in alone:
        b = fused[a["config"]["method"]["name"]]
        assert b["fused"]["size"] == len(names)
        assert (a["history"], a["test"], a["best_epoch"]) == (b["history"], b["test"], b["best_epoch"]), \
            a["config"]["method"]["name"]


def test_a_fused_rerun_is_identical_and_skips(tiny_checkpoint, glue_dir, tmp_path):
    """With dropout on, a member's masks depend on its group; the same sweep again gives the same numbers."""
    runs = [("adapter", 1e-2), ("unipelt_apl", 1e-2), ("lora", 3e-2)]
    first = run_group(sweep_configs(tiny_checkpoint, glue_dir, tmp_path / "a", runs))
    second = run_group(sweep_configs(tiny_checkpoint, glue_dir, tmp_path / "b", runs))
    for a, b in zip(first, second):
        for field in ("test", "dev_best", "best_epoch", "epochs_run", "history", "gates", "split", "fused"):
            assert a.record[field] == b.record[field], field
    again = run_group(sweep_configs(tiny_checkpoint, glue_dir, tmp_path / "a", runs))
    assert all(o.skipped and o.status == "ok" for o in again)


def test_members_stop_on_their_own_and_a_crash_fails_only_the_unfinished(quiet_checkpoint, glue_dir, tmp_path,
                                                                         monkeypatch):
    import peltbench.train

    short = sweep_configs(quiet_checkpoint, glue_dir, tmp_path, [("adapter", 1e-2)], seeds=(111,))[0]
    long = sweep_configs(quiet_checkpoint, glue_dir, tmp_path, [("lora", 3e-2)], seeds=(111,))[0]
    short.train.epochs = 1  # leaves the group after epoch 1; its record is written then
    real, calls = peltbench.train._train_steps, []

    def crash_in_epoch_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(peltbench.train, "_train_steps", crash_in_epoch_two)
    finished, crashed = run_group([short, long])
    assert finished.status == "ok" and finished.record["epochs_run"] == 1
    assert crashed.status == "failed" and crashed.record["error"] == "RuntimeError: CUDA out of memory (simulated)"
    monkeypatch.undo()
    skipped, retried = run_group([short, long])
    assert skipped.skipped and not retried.skipped and retried.status == "ok"
    assert retried.record["fused"] is None or retried.record["fused"]["size"] == 2


def test_a_non_finite_loss_fails_its_member_and_says_where(quiet_checkpoint, glue_dir, tmp_path):
    runs = [("adapter", 1e10), ("lora", 3e-2)]
    exploded, fine = run_group(sweep_configs(quiet_checkpoint, glue_dir, tmp_path, runs, seeds=(111,)))
    assert exploded.status == "failed" and "the training loss became" in exploded.record["error"]
    assert "at epoch 2, step 1 of 1" in exploded.record["error"]  # the first step is finite; its update explodes
    assert fine.status == "ok"
    text = next(tmp_path.rglob("adapter*/**/result.json")).read_text()
    assert "NaN" not in text and "Infinity" not in text


def _cfg(**changes):
    cfg = compose_config("method=adapter", "task=rte", "fuse=true")
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def test_plan_groups_fuses_only_compatible_runs():
    cfgs = [
        _cfg(), _cfg(seed=222), _cfg(**{"method.lr": 1e-3}),  # one group: seeds and lr may differ
        _cfg(k=500),                                             # another K
        _cfg(**{"train.max_length": 64}),                        # another max length
        compose_config("method=ft", "task=rte", "fuse=true"),    # fine-tuning trains alone
        compose_config("method=lora", "task=rte", "fuse=false"),  # not fused
        compose_config("method=lora", "task=rte", "fuse=true"),  # joins the first group
        compose_config("method=unipelt_apl", "task=rte", "fuse=true", "method.gate_pooling=padded"),
        compose_config("method=adapter", "task=mrpc", "fuse=true"),
        compose_config("method=prompt", "task=rte", "fuse=true"),  # prompts shift positions: its own group
    ]
    assert plan_groups(cfgs) == [[0, 1, 2, 7], [3], [4], [5], [6], [8], [9], [10]]
    capped = [_cfg(fuse_members=2) for _ in range(5)]
    assert plan_groups(capped) == [[0, 1], [2, 3], [4]]


def test_padded_gate_pooling_pads_every_batch_to_max_length(quiet_checkpoint, glue_dir, tmp_path, monkeypatch):
    from peltbench.methods.base import Gate

    widths = set()
    real = Gate.forward

    def spy(self, x, *args):
        widths.add(x.shape[1])
        return real(self, x, *args)

    monkeypatch.setattr(Gate, "forward", spy)
    cfg = sweep_configs(quiet_checkpoint, glue_dir, tmp_path, [("unipelt_ap", 1e-2)], seeds=(111,),
                        **{"method.gate_pooling": "padded", "train.max_length": 24, "train.epochs": 1})[0]
    [outcome] = run_group([cfg])
    assert outcome.status == "ok" and widths == {24}
    masked = sweep_configs(quiet_checkpoint, glue_dir, tmp_path, [("unipelt_ap", 1e-2)], seeds=(111,),
                           **{"train.max_length": 24, "train.epochs": 1})[0]
    widths.clear()
    [other] = run_group([masked])
    assert len(widths) > 1 and other.record["gates"] != outcome.record["gates"]
    assert other.record["config_hash"] != outcome.record["config_hash"]


def test_memory_cap_splits_a_group_that_would_not_fit_the_device(tiny_checkpoint, monkeypatch):
    from peltbench import runner
    from peltbench.runner import memory_cap

    cfgs = [compose_config("method=unipelt_apl", "task=rte", f"model.name={tiny_checkpoint}") for _ in range(40)]
    task = TaskSpec.from_config(cfgs[0].task)
    monkeypatch.setattr(runner, "available_memory", lambda: 1 << 40)
    assert memory_cap(cfgs, task, torch.device("cpu"), False) == 40
    monkeypatch.setattr(runner, "available_memory", lambda: 60 << 20)  # a CPU with 60 MiB free: in parts
    cpu = memory_cap(cfgs, task, torch.device("cpu"), False)
    assert 1 <= cpu < 40
    assert memory_cap(cfgs, task, torch.device("cpu"), False, longest=20) > cpu  # short rows: batches pad to them
    monkeypatch.setattr(runner, "available_memory", lambda: None)  # cannot tell: no cap
    assert memory_cap(cfgs, task, torch.device("cpu"), False) == 40
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 40, 1 << 40))
    assert memory_cap(cfgs, task, torch.device("cuda"), True) == 40  # plenty of room
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 << 20, 1 << 40))
    few = memory_cap(cfgs, task, torch.device("cuda"), True)
    assert 1 <= few < 40
    assert memory_cap(cfgs, task, torch.device("cuda"), False) < few  # fp32 activations take twice the room


def test_batch_shapes_suit_the_device(tiny_checkpoint):
    """A GPU evaluates eval_batch_size rows per member per pass; a CPU shares them out among the members and may
    split a training step by length."""
    from types import SimpleNamespace

    from peltbench.runner import group_settings

    cfg = compose_config("method=adapter", "task=rte", f"model.name={tiny_checkpoint}", "train.eval_batch_size=100")
    group = SimpleNamespace(members=SimpleNamespace(count=3, padded_pooling=False))
    cpu = group_settings(cfg, group, 0, torch.device("cpu"), False)
    assert (cpu.eval_batch_size, cpu.split_by_length) == (34, True)
    gpu = group_settings(cfg, group, 0, torch.device("cpu"), False, shapes_for="cuda")
    assert (gpu.eval_batch_size, gpu.split_by_length) == (100, False)


def test_a_step_in_length_sorted_pieces_has_the_same_loss_and_gradients():
    """On the CPU a step runs in length-sorted parts of each member's rows (here two of 4 rows: shorter, longer), cut
    where that member's own rows put them, whatever the other members' rows are."""
    from peltbench.data import Encoded
    from peltbench.train import GroupSettings, member_losses, pieces

    lengths = [4, 30, 5, 28, 6, 31, 4, 29, 7, 33, 3, 27, 8, 26, 5, 32]
    generator = torch.Generator().manual_seed(0)
    ids = [[2, *torch.randint(5, 60, (n - 2,), generator=generator).tolist(), 3] for n in lengths]
    data = [Encoded(ids[:8], [[0] * len(i) for i in ids[:8]], np.array([0, 1, 1, 0, 1, 0, 0, 1])),
            Encoded(ids[8:], [[0] * len(i) for i in ids[8:]], np.array([1, 0, 0, 1, 0, 1, 1, 0]))]
    rows = [list(range(8)), list(range(8))]
    split = GroupSettings(split_by_length=True)
    assert pieces(data, rows, split) == [[[0, 6, 2, 4], [2, 6, 0, 4]], [[3, 7, 1, 5], [5, 3, 7, 1]]]
    assert pieces(data[:1], rows[:1], split) == [[[0, 6, 2, 4]], [[3, 7, 1, 5]]]  # the same parts alone
    other = Encoded([[2, 3]] * 8, [[0, 0]] * 8, np.zeros(8, dtype=int))  # beside a member whose rows are all short
    assert [part[0] for part in pieces([data[0], other], rows, split)] == [[0, 6, 2, 4], [3, 7, 1, 5]]
    assert len(pieces(data, [r[:4] for r in rows], split)) == 1  # fewer than 2 × 4 rows: one pass
    assert len(pieces(data, rows, GroupSettings(split_by_length=True, pad_to=64))) == 1  # padded pooling: one width
    task = TaskSpec.from_config(compose_config("method=adapter", "task=rte").task)
    gradients = []
    for split in (False, True):
        model = build_pelt_model(no_dropout_backbone(), [method("unipelt_apl", {}), method("lora", {})], 42,
                                 [no_dropout_backbone()] * 2)
        group = GroupSettings(split_by_length=split)
        parts = pieces(data, rows, group)
        assert len(parts) == (2 if split else 1)
        total = 0.0
        for part in parts:
            batch = collate_group(data, part, 0, torch.device("cpu"))
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            share = member_losses(logits, batch["labels"], 2, task) * (len(part[0]) / 8)
            share.sum().backward()
            total = total + share.detach()
        gradients.append((total, {name: p.grad.clone() for name, p, _, _ in model.member_parameters()}))
    (whole, one), (split, two) = gradients
    assert_close_to_scale(whole, split, rel=1e-6)
    for name in one:
        assert_close_to_scale(one[name], two[name], floor=1e-7, msg=name)


def test_length_cuts_pad_least_and_cut_only_where_a_piece_pays():
    """The cuts are the cheapest pieces (rows × width summed, PIECE_COST of one pass per piece after the first), found
    against every set of cut positions; members may have fewer rows (an evaluation's last chunk)."""
    import itertools

    from peltbench.train import PIECE_COST, GroupSettings, length_cuts

    group = GroupSettings(split_by_length=True)

    def cost(lengths, cuts):
        total, start = 0.0, 0
        for stop in cuts:
            counts = [min(stop, len(m)) - min(start, len(m)) for m in lengths]
            width = max(m[min(stop, len(m)) - 1] for m, c in zip(lengths, counts) if c)
            total += len(lengths) * max(counts) * width
            start = stop
        return total

    generator = np.random.default_rng(0)
    for trial in range(60):
        members, rows = 1 + trial % 4, 2 + trial % 7
        lengths = [sorted(generator.integers(3, 60, size=rows - (m % 2) * (trial % 3)).tolist()) for m in range(members)]
        n = max(map(len, lengths))
        whole = cost(lengths, [n])
        best = min(cost(lengths, [*cuts, n]) + PIECE_COST * whole * len(cuts)
                   for k in range(n) for cuts in itertools.combinations(range(1, n), k))
        cuts = length_cuts(lengths, group) or [n]
        assert cuts[-1] == n and cuts == sorted(set(cuts))
        assert cost(lengths, cuts) + PIECE_COST * whole * (len(cuts) - 1) == pytest.approx(best), lengths
    assert length_cuts([[4, 5, 15, 16, 30, 31], [4, 6, 15, 17, 29, 31]], group) == [2, 4, 6]  # three lengths: three
    assert length_cuts([[4, 5, 15, 16, 30, 31]], GroupSettings(split_by_length=False)) is None  # a GPU: one pass
    assert length_cuts([[4, 5, 15, 16, 30, 31]], GroupSettings(split_by_length=True, pad_to=64)) is None


def test_an_evaluation_in_length_sorted_pieces_scores_what_one_pass_scores():
    """Evaluation chunks cut into pieces (members with fewer rows in a chunk, or none) give every row's output."""
    from peltbench.data import Encoded
    from peltbench.train import EvaluationSet, GroupSettings, evaluate

    generator = torch.Generator().manual_seed(1)
    data = []
    for size in (7, 3, 5):
        lengths = torch.randint(2, 40, (size,), generator=generator).tolist()
        ids = [[2, *torch.randint(5, 60, (n,), generator=generator).tolist(), 3] for n in lengths]
        data.append(Encoded(ids, [[0] * len(i) for i in ids], torch.randint(0, 2, (size,), generator=generator).numpy()))
    task = TaskSpec.from_config(compose_config("method=adapter", "task=rte").task)
    model = build_pelt_model(no_dropout_backbone(), [method("unipelt_apl", {}), method("lora", {}),
                                                      method("prefix", {})], 42, [no_dropout_backbone()] * 3)
    outputs = []
    for split in (False, True):
        group = GroupSettings(eval_batch_size=4, split_by_length=split)
        sets = [EvaluationSet(d, group) for d in data]
        if split:
            from peltbench.train import _evaluation_pieces
            assert len(_evaluation_pieces(sets, 0, group)) > 1  # the lengths differ enough to cut
        outputs.append(evaluate(model, sets, task, group, "dev", keep=True)[2])
    for one, cut in zip(*outputs):
        assert_close_to_scale(torch.from_numpy(cut), torch.from_numpy(one), rel=1e-5)


def test_a_step_a_few_members_at_a_time_trains_what_one_pass_trains():
    """On the CPU a step's forward and backward run a few members at a time (members_per_pass); the optimiser updates
    each parameter over the span of members that train it. Both give the losses and weights of one whole pass."""
    from peltbench.data import Encoded
    from peltbench.train import GroupSettings, Member, TrainSettings, _DataOrder, _train_steps, member_passes

    assert member_passes(5, GroupSettings(members_per_pass=2)) == [[0, 1], [2, 3], [4]]
    assert member_passes(5, GroupSettings()) == [[0, 1, 2, 3, 4]]
    names = [("adapter", {}), ("adapter", {}), ("bitfit", {}), ("lora", {}), ("lora", {"lora_rank": 2}),
             ("prefix", {}), ("ia3", {}), ("unipelt_apl", {})]
    generator = torch.Generator().manual_seed(0)
    task = TaskSpec.from_config(compose_config("method=adapter", "task=rte").task)
    data = []
    for _ in names:
        ids = [[2, *torch.randint(5, 60, (int(n),), generator=generator).tolist(), 3]
               for n in torch.randint(2, 20, (8,), generator=generator)]
        data.append(Encoded(ids, [[0] * len(i) for i in ids], torch.randint(0, 2, (8,), generator=generator).numpy()))
    results = []
    for per_pass in (None, 3, 1):
        methods = [method(name, changes) for name, changes in names]
        model = build_pelt_model(no_dropout_backbone(), methods, [42 + i for i in range(len(names))],
                                 [no_dropout_backbone()] * len(names))
        members = [Member(f"m{i}", d, d, d, TrainSettings(lr=1e-2 * (1 + i % 3), seed=42 + i, data_seed=i))
                   for i, d in enumerate(data)]
        optimizer = MemberAdamW(model)
        for m in range(len(members)):
            optimizer.schedule(m, members[m].settings.lr, 10)
        spans = dict(zip([name for name, *_ in model.member_parameters()], optimizer.banks[0].slots))
        initial = {name: p.detach().clone() for name, p, _, _ in model.member_parameters()}
        gradients, step = {}, optimizer.step

        def keep_first_gradients(index, step=step, gradients=gradients, model=model):
            if not gradients:  # the first step's clipped gradients, as the optimiser reads them
                gradients.update({name: p.grad.clone() for name, p, _, _ in model.member_parameters()})
            step(index)

        optimizer.step = keep_first_gradients
        group = GroupSettings(batch_size=4, members_per_pass=per_pass, split_by_length=True)
        active = list(range(len(members)))
        losses, bad = _train_steps(model, members, active, task, group, optimizer, torch.ones(len(members)),
                                   _DataOrder(members, 2), 0, 3)
        assert bad == [-1] * len(members)
        results.append((losses, gradients, {name: p.detach().clone() for name, p, _, _ in model.member_parameters()}))
    prefix = spans["prefix_encoder.embedding"]
    assert prefix[1] - prefix[0] == 3  # prefix (slot 5), unipelt_apl (7) and ia3 between them (6, masked)
    (losses, gradients, weights), *others = results
    for other_losses, other_gradients, other_weights in others:
        np.testing.assert_allclose(other_losses, losses, rtol=1e-5)
        for name in gradients:
            assert_close_to_scale(other_gradients[name], gradients[name], floor=1e-7, msg=name)
    # (weights after several steps are not compared elementwise: AdamW's first step is lr·sign(g), so an element whose
    # gradient is ~0 (a key bias) takes either sign under rounding; the losses of steps 2 and 3 show the updates agree)
    trained = [name for name in weights if (weights[name] - initial[name]).abs().max() > 1e-3]
    assert len(trained) > len(weights) // 2


def test_a_learning_rate_and_rank_grid_is_one_group_and_padded_pooling_or_ft_apart():
    """The grid of a selection on dev (issue 20 item 2) fuses: learning rates and shapes (LoRA rank, adapter bottleneck)
    may differ within a group; fine-tuning and padded gate pooling (another batch shape) train apart."""
    grid = [compose_config(f"method={name}", "task=rte", f"method.lr={lr}", "fuse=true", *extra)
            for name, extra in (("lora", []), ("lora", ["method.lora_rank=16"]), ("adapter", ["method.bottleneck=64"]))
            for lr in (1e-4, 3e-4, 1e-3)]
    assert plan_groups(grid) == [list(range(9))]
    apart = [compose_config("method=ft", "task=rte", "fuse=true"),
             compose_config("method=unipelt_apl", "task=rte", "fuse=true", "method.gate_pooling=padded")]
    assert plan_groups(grid + apart) == [list(range(9)), [9], [10]]
