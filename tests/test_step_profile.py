"""Where a fused group's training step goes (issue 38): scripts/benchmark_fused.py --profile counts each phase's aten
operators and the host syncs; the step's shared machinery (optimiser, clipping, zero_grad, bookkeeping) dispatches a
few operators per group, not per tensor, and reads nothing back to the host."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from conftest import compose_config
from test_fusion import method, no_dropout_backbone
from peltbench.data import Encoded
from peltbench.methods import build_pelt_model
from peltbench.tasks import TaskSpec
import peltbench.train as train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import benchmark_fused as bench  # noqa: E402


def tiny_group(names, rows: int = 8):
    """A group of the given methods on the tiny BERT (dropout off), each member with its own rows; ready to train."""
    generator = torch.Generator().manual_seed(0)
    data = []
    for _ in names:
        ids = [[2, *torch.randint(5, 60, (int(n),), generator=generator).tolist(), 3]
               for n in torch.randint(2, 20, (rows,), generator=generator)]
        data.append(Encoded(ids, [[0] * len(i) for i in ids], torch.randint(0, 2, (rows,), generator=generator).numpy()))
    methods = [method(name, changes) for name, changes in names]
    model = build_pelt_model(no_dropout_backbone(), methods, [42 + i for i in range(len(names))],
                             [no_dropout_backbone()] * len(names))
    members = [train.Member(f"m{i}", d, d, d, train.TrainSettings(lr=1e-2 * (1 + i % 3), seed=42 + i, data_seed=i))
               for i, d in enumerate(data)]
    group = train.GroupSettings(batch_size=4)
    task = TaskSpec.from_config(compose_config("method=adapter", "task=rte").task)
    started = train.start_training(model, members, group)
    active = list(range(len(members)))
    model.members.set_active(active, group.device)

    def steps(first: int, count: int = 1):
        return train._train_steps(model, members, active, task, group, *started[1:], first, count)
    owners = {"model": model, "members": model.members, "optimizer": started[1], "order": started[3], "data": data}
    return steps, owners


NAMES = [("adapter", {}), ("lora", {}), ("lora", {"lora_rank": 2}), ("prefix", {}), ("bitfit", {})]


def test_the_profile_counts_every_operator_of_a_step_in_one_phase_and_undoes_its_wrapping():
    steps, owners = tiny_group(NAMES)
    originals = (train.collate_group, torch.Tensor.tolist, torch.Tensor.backward)
    steps(0)
    with bench.OperatorCount() as whole:
        steps(1)
    counter = bench.PhaseCount()
    with bench.phases_of(counter, owners), counter:
        steps(3)  # the same place in an epoch as step 1 (2 steps per epoch): no new data order
    assert sum(counter.ops.values()) == whole.count  # nothing lost, nothing counted twice
    for phase in ("data", "forward", "loss", "backward", "optimizer"):
        assert counter.ops[phase] > 0, phase
    assert (train.collate_group, torch.Tensor.tolist, torch.Tensor.backward) == originals
    assert "forward" not in vars(owners["model"]) and "step" not in vars(owners["optimizer"])


def test_the_profile_finds_host_syncs_and_says_where():
    counter = bench.PhaseCount()
    x = torch.arange(4.0)
    with bench.phases_of(counter, {}), counter:
        with counter.within("optimizer"):
            x.sum().item()
            x[x > 1].sum()
        x.tolist()
    assert counter.syncs == {"optimizer": 2, "loop": 1}
    assert any("_local_scalar_dense" in what and "test_step_profile.py" in site for _, what, site in counter.sites)


SHARED = ("data", "loop", "clip", "optimizer", "zero_grad", "loop after")  # the step's machinery, not the components'


def profiled_step(names, first: int = 1, count: int = 1, rows: int = 8):
    steps, owners = tiny_group(names, rows)
    steps(0)
    counter = bench.PhaseCount()
    with bench.phases_of(counter, owners), counter:
        steps(first, count)
    return counter


def test_the_optimiser_clipping_and_bookkeeping_cost_a_few_operators_whatever_the_group():
    """Clipping, AdamW, zero_grad, the loss bookkeeping and the collation: the same few computing operators for 2 LoRA
    members as for a group of 8 members of 6 methods (many more tensors, members that train only some of them), but 4
    for each further table of the clip's member norms (members with the same number of parameters form one table:
    torch's norm of each member's parameter norms, bit for bit, issue 48; one per distinct number, never per member),
    and one view (slice) per parameter whose span of members is not all of it: its new gradient's span."""
    counters, partial, tables = [], [], []
    for names in ([("lora", {}), ("lora", {})], [*NAMES, ("ia3", {}), ("ln", {}), ("unipelt_apl", {})]):
        steps, owners = tiny_group(names)
        steps(0)
        counter = bench.PhaseCount()
        with bench.phases_of(counter, owners), counter:
            steps(1)
        counters.append(counter)
        partial.append(sum(cut is not None for bank in owners["optimizer"].banks for cut in bank.cuts))
        tables.append(len(owners["optimizer"]._norm_rows.tables))
    computing = [sum(n for (phase, name), n in c.names.items() if phase in SHARED and name != "slice") for c in counters]
    views = [sum(n for (phase, name), n in c.names.items() if phase in SHARED and name == "slice") for c in counters]
    optimizer = [{name: n for (phase, name), n in c.names.items() if phase == "optimizer"} for c in counters]
    assert tables[0] == 1 and 1 < tables[1] <= len(NAMES) + 3 and optimizer[0] == optimizer[1], (tables, optimizer)
    # + zeroing the table of totals, and its untrained slots
    assert computing[1] <= computing[0] + 4 * (tables[1] - 1) + 3, (computing, tables)
    assert partial[1] > 20 and views == [2 + partial[0], 2 + partial[1]], (views, partial)  # 2: the dropout keys'


def test_a_period_reads_one_value_back_from_the_device_at_its_end():
    """No `.item()`, `.tolist()`, `.cpu()` or data-dependent shape inside the steps: the losses come back once, when
    the period ends (the optimiser's learning rates are host floats). Steps 1-3 of 4 per epoch: the data order's
    new permutation (a host tensor) is drawn at step 4."""
    counter = profiled_step(NAMES, first=1, count=3, rows=16)
    ours = {phase: n for phase, n in counter.syncs.items() if phase in SHARED}
    assert ours == {"loop after": 1}, sorted(counter.sites)


def test_an_evaluation_pass_assembles_its_batch_in_a_few_operators_whatever_the_group():
    """The members' chunks are stacked on the host and copied at once; the outputs come back in one copy."""
    task = TaskSpec.from_config(compose_config("method=adapter", "task=rte").task)
    outside = []
    for names in ([("lora", {})], NAMES):
        steps, owners = tiny_group(names)
        model = owners["model"]
        group = train.GroupSettings(eval_batch_size=4)
        sets = [train.EvaluationSet(train.Encoded(d.input_ids[:6], d.token_type_ids[:6], d.labels[:6]), group)
                for d in owners["data"]]
        counter = bench.PhaseCount()
        with bench.phases_of(counter, owners), counter:
            train.evaluate(model, sets, task, group, "dev")
        outside.append(sum(counter.ops.values()) - counter.ops["forward"])
        assert {phase: n for phase, n in counter.syncs.items() if phase != "forward"} == {"loop": 1}  # the outputs
    assert outside[0] == outside[1] <= 20, outside  # 2 passes: their batches, gate rows; the outputs


def test_a_parameter_without_a_gradient_is_left_as_it_is():
    """As torch.optim.AdamW skips a parameter whose .grad is None (a component none of whose members is in the pass
    any more), the flat optimiser leaves it unchanged while the others step; between steps it keeps only its
    moments (the gradient buffers' storage is handed back)."""
    methods = [method("adapter", {}), method("lora", {})]
    model = build_pelt_model(no_dropout_backbone(), methods, 42, [no_dropout_backbone()] * 2)
    optimizer = train.MemberAdamW(model)
    for m in range(2):
        optimizer.schedule(m, 1e-2, 10)
    parameters = [p for _, p, _, _ in model.member_parameters()]
    generator = torch.Generator().manual_seed(0)
    for step in range(2):
        for p in parameters:
            p.grad = torch.randn(p.shape, generator=generator)
        parameters[0].grad = None
        before = [p.detach().clone() for p in parameters]
        train.clip_per_member(optimizer, torch.ones(2))
        optimizer.step(step)
        optimizer.zero_grad()
        assert torch.equal(parameters[0], before[0])
        assert all(not torch.equal(p, b) for p, b in zip(parameters[1:], before[1:]))
    kept = sum(2 * bank.span_size * bank.exp_avg.element_size()  # the moments, and the segments' indices
               + sum(t.nbytes for t in (bank.segment_index, bank.lengths)) for bank in optimizer.banks)
    assert bench.optimizer_bytes(optimizer) == kept
