"""What a fused group's components cost (issue 38, items 2 and 4): a component's work per step is a few batched
operators whatever its number of matrices, nothing in a training step's forward, backward or budget step reads a value
back to the host, and a component keeps for the backward pass only its own members' rows (no H × H matrix per
member)."""

from __future__ import annotations

import torch

from test_step_profile import bench, profiled_step, tiny_group
from peltbench.methods.hra import reflections
from peltbench.methods.ia3 import Scale
from peltbench.methods.rotation import InputRotation


def budget_operators(targets: list[str]) -> int:
    """Operators of AdaLoRA's budget step (importance, masks) for two AdaLoRA members beside a LoRA member."""
    names = [("adalora", {"adalora_targets": targets, "adalora_tinit": 0.0, "adalora_tfinal": 0.1}),
             ("lora", {}), ("adalora", {"adalora_targets": targets, "adalora_tinit": 0.0, "adalora_tfinal": 0.1})]
    steps, owners = tiny_group(names)
    steps(0, 2)  # step 1 masks for the first time
    counter = bench.PhaseCount()
    with bench.phases_of(counter, owners), counter:
        steps(2)
    return counter.ops["after_step"]


def test_adaloras_budget_step_is_the_same_few_operators_for_one_matrix_per_layer_or_four():
    """The importance EMA of every P, Λ, Q in one foreach operator per term, the scores and masks one operation per
    kind and shape of tensor: four H × H matrices per layer cost what one costs (cadcef0: 174 operators for one, 600
    for four)."""
    one, four = budget_operators(["query"]), budget_operators(["query", "key", "value", "attention_output"])
    assert 0 < four == one <= 60, (one, four)


def test_a_training_step_reads_nothing_back_to_the_host_in_forward_backward_or_the_budget_step():
    """Not the active members' slots (Members keeps them on the host), not transformers' check whether a batch has
    padding (a training step always makes the mask on the device), not AdaLoRA's budget (decided from the step number)."""
    names = [("adalora", {"adalora_tinit": 0.0, "adalora_tfinal": 0.1}), ("lora", {}), ("unipelt_apl", {}),
             ("hra", {}), ("ia3", {}), ("bitfit", {}), ("ln", {}), ("dora", {}), ("vera", {}), ("oft", {})]
    counter = profiled_step(names, first=1, count=2)
    components = {phase: n for phase, n in counter.syncs.items() if phase in ("forward", "loss", "backward", "after_step")}
    assert components == {}, sorted(counter.sites)


def saved_by(model, kinds: tuple[type, ...], step) -> list[tuple[int, torch.Size]]:
    """(storage elements, shape) of each tensor a training step keeps for its backward pass from an operator of a
    module of `kinds` itself (not of a module inside it)."""
    inside, saved = [], []

    def pack(tensor):
        if inside and inside[-1]:
            saved.append((tensor.untyped_storage().nbytes() // tensor.element_size(), tensor.shape))
        return tensor
    def leave(*_):
        inside.pop()

    handles = []
    for module in model.modules():
        mine = isinstance(module, kinds)
        handles.append(module.register_forward_pre_hook(lambda *_, mine=mine: inside.append(mine)))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            step()
    finally:
        for handle in handles:
            handle.remove()
    return saved


def test_a_mixed_groups_components_keep_only_their_own_members_rows_and_no_h_by_h_matrix():
    """One (IA)³ and one HRA member among six LoRA members: what (IA)³ keeps for the scales' gradients is its own
    member's rows (cadcef0: every member's keys, values and FFN activations), and HRA keeps no H × H matrix (cadcef0:
    one per reflection)."""
    names = [("lora", {})] * 3 + [("ia3", {}), ("hra", {})] + [("lora", {})] * 3
    steps, owners = tiny_group(names)
    model = owners["model"]
    steps(0)
    hidden, inner = model.hidden_size, model.config.intermediate_size
    tokens = max(len(ids) for data in owners["data"] for ids in data.input_ids)  # a batch's width, at most
    scales = saved_by(model, (Scale,), lambda: steps(1))
    assert scales and max(size for size, _ in scales) <= 4 * tokens * inner  # batch 4: one member's rows
    rotations = saved_by(model, (InputRotation,), lambda: steps(1))
    assert rotations and not [shape for _, shape in rotations if tuple(shape[-2:]) == (hidden, hidden)]


def test_hras_compact_form_is_the_product_of_its_reflections():
    """R = I − Û T Ûᵀ (what the model applies) against H_1 ⋯ H_r multiplied out, in float64."""
    generator = torch.Generator().manual_seed(0)
    u = torch.randn(3, 24, 5, generator=generator, dtype=torch.float64)
    unit = u / u.norm(dim=1, keepdim=True)
    product = torch.eye(24, dtype=torch.float64).expand(3, -1, -1)
    for i in range(5):
        column = unit[..., i : i + 1]
        product = product @ (torch.eye(24, dtype=torch.float64) - 2 * column @ column.transpose(1, 2))
    torch.testing.assert_close(reflections(u, False), product, rtol=0, atol=1e-12)
