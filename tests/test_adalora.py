"""AdaLoRA (methods/adalora.py, adalora_budget.py) against PEFT 0.21's AdaLoraModel on tiny random encoders: its
budget over a whole schedule; fused groups, saved runs, gates, settings. One forward and backward against PEFT (logits,
loss with the regulariser, gradients of P, Λ, Q, counts, the PEFT copy with its rank_pattern) on every encoder:
tests/test_peft_matrix.py.

Tiny models have O(1) weights (initializer_range=0.2) and non-zero Λ, P, Q, so every path of the update matters.
Tolerances: 1e-5 relative / 1e-6 absolute on logits and losses (tests/test_encoders.py); gradients 5e-6 of their largest
entry absolute (Λ's gradient sums O(1) products over every position and both dimensions).
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_to_scale
from test_encoders import batch, build, method, model_inputs
from test_fusion import quiet_checkpoint  # noqa: F401  (a fixture: the tiny BERT with dropout off)
from peltbench.methods import after_step, member_state, plan_training

O1 = {"initializer_range": 0.2}
ALL = ["query", "key", "value", "attention_output", "intermediate", "output"]
DENSE = ["attention_output", "intermediate", "output"]
# The Linear each target names in PEFT's model, per architecture (a regex over module names: `output.dense` alone
# would also match the attention output's).
PEFT_NAMES = {
    "bert": {"query": r"attention\.self\.query", "key": r"attention\.self\.key", "value": r"attention\.self\.value",
             "attention_output": r"attention\.output\.dense", "intermediate": r"intermediate\.dense",
             "output": r"layer\.\d+\.output\.dense"},
    "deberta-v2": {"query": r"query_proj", "key": r"key_proj", "value": r"value_proj",
                   "attention_output": r"attention\.output\.dense", "intermediate": r"intermediate\.dense",
                   "output": r"layer\.\d+\.output\.dense"},
    "modernbert": {"query": r"attn\.Wqkv", "key": r"attn\.Wqkv", "value": r"attn\.Wqkv",
                   "attention_output": r"attn\.Wo", "intermediate": r"mlp\.Wi", "output": r"mlp\.Wo"},
}
PEFT_NAMES["roberta"] = PEFT_NAMES["bert"]


def adalora(targets, gamma, **changes):
    return method("adalora", adalora_targets=targets, adalora_orth_reg=gamma, **changes)


def peft_adalora(model_type: str, ours, config, total_step: int, tinit: int = 0, tfinal: int = 0):
    """PEFT's AdaLoRA on the same model and matrices, with our P, Λ, Q copied in. ModernBERT's Wqkv is one matrix
    to PEFT: rank 3r₀, Q and Λ stacked [q; k; v], P block-diagonal, and α tripled so that α/rank is ours."""
    from peft import AdaLoraConfig, get_peft_model

    from conftest import tiny_encoder

    names = PEFT_NAMES[model_type]
    pattern = r".*\.(" + "|".join(sorted({names[t] for t in config.adalora_targets})) + r")$"
    peft_config = AdaLoraConfig(
        task_type="SEQ_CLS", init_r=config.adalora_init_rank, target_r=config.adalora_target_rank,
        lora_alpha=config.adalora_alpha, target_modules=pattern, lora_dropout=0.0, total_step=total_step,
        tinit=tinit, tfinal=tfinal, deltaT=config.adalora_delta_t, beta1=config.adalora_beta1,
        beta2=config.adalora_beta2, orth_reg_weight=config.adalora_orth_reg)
    peft = get_peft_model(tiny_encoder(model_type, dropout=0.0, **O1), peft_config)
    for plain, module in peft_modules(peft).items():
        if plain.endswith("Wqkv"):  # rank 3r₀ (PEFT gives every matrix init_r)
            module.update_layer("default", 3 * config.adalora_init_rank, config.adalora_alpha, config=peft_config)
    copy_into_peft(ours, peft, config.adalora_init_rank, config.adalora_alpha)
    return peft


def peft_modules(peft):
    return {name.removeprefix("base_model.model."): module for name, module in peft.named_modules()
            if hasattr(module, "lora_E") and "default" in module.lora_E}


@torch.no_grad()
def copy_into_peft(ours, peft, rank: int, alpha: float) -> None:
    state = member_state(ours, 0)
    for plain, module in peft_modules(peft).items():
        if plain.endswith("Wqkv"):
            blocks = [f"{plain}.adalora_{t}" for t in ("query", "key", "value")]
            module.lora_A["default"].copy_(torch.cat([state[f"{b}.lora_A"] for b in blocks]))
            module.lora_E["default"].copy_(torch.cat([state[f"{b}.lora_E"] for b in blocks]))
            module.lora_B["default"].copy_(torch.block_diag(*[state[f"{b}.lora_B"] for b in blocks]))
            module.scaling["default"] = 3 * alpha
        else:
            for name in ("lora_A", "lora_E", "lora_B"):
                getattr(module, name)["default"].copy_(state[f"{plain}.{name}"])


def peft_grads(peft) -> dict[str, torch.Tensor]:
    """PEFT's gradients under our names (ModernBERT's Wqkv split into its blocks)."""
    grads = {}
    for plain, module in peft_modules(peft).items():
        a, e, b = (getattr(module, n)["default"].grad for n in ("lora_A", "lora_E", "lora_B"))
        if plain.endswith("Wqkv"):
            rank, size = a.shape[0] // 3, b.shape[0] // 3
            for i, target in enumerate(("query", "key", "value")):
                rows, block = slice(i * rank, (i + 1) * rank), slice(i * size, (i + 1) * size)
                grads |= {f"{plain}.adalora_{target}.lora_A": a[rows], f"{plain}.adalora_{target}.lora_E": e[rows],
                          f"{plain}.adalora_{target}.lora_B": b[block, rows]}
        else:
            grads |= {f"{plain}.lora_A": a, f"{plain}.lora_E": e, f"{plain}.lora_B": b}
    return grads


def randomise(model) -> None:
    """Λ away from zero, and P, Q at O(1), so that the update and the regulariser matter."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("lora_A", "lora_E", "lora_B"):
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize("model_type,targets", [("bert", ALL), ("deberta-v2", ALL), ("modernbert", DENSE)])
def test_budget_steps_mask_the_triplets_peft_masks(model_type, targets):
    """Driven by the same gradients over a whole tiny schedule (T = 10, t_i = 1, t_f = 3, Δt = 1), our allocator
    masks the triplets PEFT's update_and_allocate masks, step by step, and ends with PEFT's rank pattern."""
    pytest.importorskip("peft")
    config = adalora(targets, 0.1, adalora_init_rank=6, adalora_target_rank=2, adalora_tinit=0.1, adalora_tfinal=0.3)
    ours = build(model_type, config, **O1).train()
    randomise(ours)
    peft = peft_adalora(model_type, ours, config, total_step=10, tinit=1, tfinal=3).train()
    plan_training(ours, [10])
    ours_params = {ours.stored_name(n): p for n, p, _, _ in ours.member_parameters() if ".lora_" in n}
    labels = torch.tensor([0, 1, 1])
    kept = []
    for step in range(10):
        output = peft(**model_inputs(model_type, *batch(model_type)), labels=labels)
        output.loss.backward()
        with torch.no_grad():  # the same gradients, the same update, on both
            theirs = peft_grads(peft)
            for name, parameter in ours_params.items():
                parameter.grad = theirs[name].unsqueeze(0).clone()
                parameter[0] -= 0.5 * theirs[name]
            for module in peft_modules(peft).values():
                for n in ("lora_A", "lora_E", "lora_B"):
                    getattr(module, n)["default"].sub_(0.5 * getattr(module, n)["default"].grad)
        peft.base_model.update_and_allocate(step)
        after_step(ours, step)
        peft.zero_grad()
        for parameter in ours_params.values():
            parameter.grad = None
        ours_e = {name: p[0] for name, p in ours_params.items() if name.endswith("lora_E")}
        theirs_e = {name[: -len(".lora_A")] + ".lora_E": t for name, t in split_e(peft).items()}
        for name, e in theirs_e.items():
            assert_close_to_scale(ours_e[name], e, msg=f"step {step}: {name}")
        kept.append(sum(int((e != 0).sum()) for e in ours_e.values()))
    matrices = 2 * len(targets)
    assert kept[0] == 6 * matrices and kept[-1] == 2 * matrices  # from the initial budget to the target
    pattern = peft.peft_config["default"].rank_pattern
    ranks = sorted(sum(mask) for mask in pattern.values())
    assert ranks == sorted(sum(mask) for mask in ours.adalora.rank_pattern(0))
    assert ranks != [2] * matrices  # the budget moved between matrices: a uniform cut would not pass


def split_e(peft) -> dict[str, torch.Tensor]:
    """PEFT's Λ per adapted matrix, keyed by the matrix's lora_A name (ModernBERT's dense matrices only here)."""
    return {f"{plain}.lora_A": module.lora_E["default"].detach() for plain, module in peft_modules(peft).items()}


def runs(checkpoint, glue, results, *members, task: str = "mrpc", **extra):
    """One config per member (method, its overrides), small enough to train here: 4 steps per epoch."""
    from conftest import compose_config

    common = [f"model.name={checkpoint}", f"data.dir={glue}", f"results_dir={results}", f"task={task}", "k=32",
              "dev_size=20", "train.batch_size=8", "train.patience=2", "logger=[]", "device=cpu",
              *[f"{key}={value}" for key, value in extra.items()]]
    return [compose_config(f"method={name}", *common, *overrides) for name, *overrides in members]


def saved(results) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    paths = sorted(results.rglob("weights.safetensors"))
    return {str(path.parent.relative_to(results)): load_file(path) for path in paths}


def test_a_fused_group_trains_each_adalora_member_as_its_separate_run(quiet_checkpoint, glue_dir, tmp_path):
    """Two AdaLoRA members (other seeds, ranks, lengths: each its own schedule) and a LoRA in one group end as their
    separate runs: losses, dev curves, stopping, test scores, and the saved P, Λ, Q with their masks."""
    from peltbench.fusion import plan_groups
    from peltbench.runner import run_group

    members = [("adalora", "seed=111", "train.epochs=4", "method.lr=1e-2"),
               ("adalora", "seed=222", "model_seed=7", "train.epochs=3", "method.adalora_init_rank=4",
                "method.adalora_target_rank=1", "method.adalora_targets=[query,value,output]", "method.lr=2e-2"),
               ("lora", "seed=111", "train.epochs=3", "method.lr=3e-2")]
    fused_configs = runs(quiet_checkpoint, glue_dir, tmp_path / "fused", *members, fuse="true",
                         **{"save.weights": "true"})
    assert len(plan_groups(fused_configs)) == 1
    fused = run_group(fused_configs)
    separate = [run_group([cfg])[0] for cfg in runs(quiet_checkpoint, glue_dir, tmp_path / "alone", *members,
                                                    **{"save.weights": "true"})]
    for alone, member in zip(separate, fused):
        assert alone.status == member.status == "ok", (alone.error, member.error)
        a, b = alone.record, member.record
        assert b["fused"]["size"] == 3
        assert (a["best_epoch"], a["epochs_run"]) == (b["best_epoch"], b["epochs_run"])
        losses = [h["train_loss"] for h in b["history"]]
        assert [h["train_loss"] for h in a["history"]] == pytest.approx(losses, rel=1e-5)
        assert [h["dev_main"] for h in a["history"]] == pytest.approx([h["dev_main"] for h in b["history"]], abs=1e-6)
        assert a["test"] == pytest.approx(b["test"], abs=1e-6)
    alone_weights, fused_weights = saved(tmp_path / "alone"), saved(tmp_path / "fused")
    assert alone_weights.keys() == fused_weights.keys() and len(alone_weights) == 3
    for run, tensors in alone_weights.items():
        for name, tensor in tensors.items():
            assert_close_to_scale(fused_weights[run][name], tensor, msg=f"{run} {name}")
        masked = [int((t == 0).sum()) for name, t in tensors.items() if name.endswith("lora_E")]
        assert not masked or sum(masked) > 0, run  # the budget did shrink
    assert [o.record["epochs_run"] for o in separate[:2]] != [4, 4]  # the members had their own lengths


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_saved_adalora_run_reloads(model_type, tmp_path, glue_dir):
    """weights.safetensors (with the final masks in Λ) rebuilds the run. (Its peft/ copy, the masks as PEFT's
    rank_pattern, and the refusal on ModernBERT: tests/test_peft_matrix.py.)"""
    import peltbench

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.0, **O1)
    [outcome] = run_group(runs(checkpoint, glue_dir, tmp_path / "runs", ("adalora", "train.epochs=3", "method.lr=1e-2"),
                               task="rte", **{"save.weights": "true", "train.patience": 3}))
    run_dir = next((tmp_path / "runs").rglob("result.json")).parent
    loaded = peltbench.load_run(run_dir)
    scores, _ = loaded.predict()
    assert scores == pytest.approx(outcome.record["test"], abs=1e-9)
    masks = [e for name, e in member_state(loaded.model, 0).items() if name.endswith("lora_E")]
    assert 0 < sum(int((e == 0).sum()) for e in masks) < sum(e.numel() for e in masks)


# deberta-v3-base's config.json (AutoConfig.for_model's deberta-v2 defaults are the xlarge model's shapes)
DEBERTA_V3_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                       relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256,
                       max_relative_positions=-1, share_att_key=True, norm_rel_ebd="layer_norm", type_vocab_size=0,
                       position_biased_input=False, vocab_size=128100)


@pytest.mark.parametrize("model_type,changes", [("roberta", {}), ("deberta-v2", DEBERTA_V3_BASE)],
                         ids=["roberta-base", "deberta-v3-base"])
def test_counts_the_initial_budget_as_peft(model_type, changes):
    """The initial budget, as PEFT counts it: 12 layers × r₀ 12 × (4 × (768 + 768 + 1) + 2 × (768 + 3072 + 1)) =
    1,991,520 on both base models (PEFT's get_peft_model with AdaLoraConfig(init_r=12) on the six matrices counts
    the same: docs/protocol.md); the head is counted apart."""
    from transformers import AutoConfig

    from peltbench.methods import count_method

    counts = count_method(method("adalora"), AutoConfig.for_model(model_type, **changes))
    assert counts["trainable_params"] == 12 * 12 * (4 * (768 + 768 + 1) + 2 * (768 + 3072 + 1)) == 1_991_520
    assert counts["head_params"] == 768 * 768 + 768 + 2 * 768 + 2  # dense + out_proj (DeBERTa: its pooler's dense)


def test_in_a_gated_mixture_a_gate_replaces_its_scale_and_a_gateless_component_is_refused():
    """`gated: true` with [adalora, adapter]: each adapted matrix has its gate (recorded per matrix) and its update
    reaches the logits. A component that declares no gate is refused in one line."""
    from peltbench.methods import COMPONENTS, check_method

    mixture = method("adalora", gated=True, components=["adalora", "adapter"], bottleneck=8)
    model = build("bert", mixture, **O1)
    ids, mask, types = batch("bert")
    model.members.start_gate_recording()
    with torch.no_grad():
        logits = model(ids, mask, types)
    gates = model.members.stop_gate_recording()[0]
    assert sorted(gates) == sorted([f"adalora_{t}" for t in ALL] + ["adapter"])
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("lora_E"):
                parameter.fill_(0.5)
        changed = model(ids, mask, types)
    assert not torch.allclose(logits, changed)
    assert isinstance(COMPONENTS["adalora"].COMPONENT.gate, str) and COMPONENTS["bitfit"].COMPONENT.gate is None
    with pytest.raises(ValueError, match=r"gated: true, but component bitfit has no gate"):
        check_method(method("adalora", gated=True, components=["adalora", "bitfit"]))


@pytest.mark.parametrize("override,message", [
    ("method.adalora_target_rank=12", "must be below adalora_init_rank"),
    ("method.adalora_tfinal=0.9", "must be below 1"),
    ("method.adalora_beta1=1.0", "strictly between 0 and 1"),
    ("method.adalora_targets=[query,pooler]", "distinct matrices from query, key, value"),
])
def test_a_bad_setting_is_refused_in_one_line(override, message):
    from conftest import compose_config
    from peltbench import UserError
    from peltbench.config import check_config

    with pytest.raises(UserError, match=message):
        check_config(compose_config("method=adalora", "task=rte", override))
