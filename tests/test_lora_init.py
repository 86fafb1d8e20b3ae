"""LoRA's and DoRA's PiSSA and OLoRA initialisations (`method.lora_init`, methods/lora.py) against PEFT 0.21's
`init_lora_weights="pissa"|"olora"`, in fused groups, in a run's identity, saved and exported as PEFT converts them.

PEFT rewrites the frozen weight to W_res = W − s·B₀A₀; peltbench keeps W shared by a group and gives each such member
its frozen B₀, A₀: y = W x + s·(B(A x) − B₀(A₀ x)). The two agree to float rounding, checked here on tiny random
encoders with O(1) weights after A and B have moved away from their start. Tolerances as tests/test_encoders.py.
On ModernBERT (PEFT adapts the whole Wqkv, whose SVD is not its blocks') each block's A₀, B₀ are checked against PEFT's
init on a Linear holding that block. Against PEFT's converted form of such a run (a LoRA of rank 2r on the original W,
the export) on every encoder, with counts and the export loaded: rows lora-pissa ... dora-olora of
tests/test_peft_matrix.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_to_scale, assert_trained_alike, compose_config, tiny_encoder
from peltbench.methods import check_method, member_frozen, member_state, parameter_counts
from peltbench.record import config_hash, record_path
from test_devices import as_on_a_gpu  # noqa: F401 (a fixture: the GPU's path on this CPU)
from test_encoders import (assert_members_equal_their_own_models, assert_members_start_as_their_own_models, build,
                           method, mixed_group, same_logits_then_backward)

O1 = {"initializer_range": 0.2}
UNFUSED = ["bert", "deberta-v2", "electra", "roberta"]
INITS = ["pissa", "olora"]
H = 32


def moved(model) -> None:
    """What each member trains of A and B (and DoRA's m) away from its principal start, so that B A − B₀ A₀ ≠ 0 (a
    LoRA-FA member's A stays: it is frozen)."""
    generator = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, parameter, flags, _ in model.member_parameters():
            for slot in [slot for slot, trains in enumerate(flags) if trains]:
                noise = torch.randn(parameter[slot].shape, generator=generator)
                if name.endswith(("lora_a.weight", "lora_b.weight")):
                    parameter[slot].add_(0.2 * noise)
                elif name.endswith("magnitude"):
                    parameter[slot].mul_(1 + 0.2 * noise)


def peft_principal(model_type: str, init: str, dora: bool):
    """PEFT's LoRA (DoRA) on the plain model with init_lora_weights=init: its base weights become W_res."""
    from peft import LoraConfig, get_peft_model
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    config = LoraConfig(r=8, lora_alpha=16, target_modules=DEFAULTS[model_type], lora_dropout=0.0,
                        init_lora_weights=init, use_dora=dora, task_type="SEQ_CLS")
    return get_peft_model(tiny_encoder(model_type, dropout=0.0, **O1), config)


def lora_modules(peft):
    for name, module in peft.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            yield name.removeprefix("base_model.model."), module


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("model_type", UNFUSED)
def test_principal_init_equals_peft(model_type, init, dora):
    """The start (A₀, B₀, DoRA's m) is PEFT's; after A, B, m move, logits and gradients equal PEFT's on W_res."""
    pytest.importorskip("peft")
    ours = build(model_type, method("dora" if dora else "lora", lora_init=init), **O1)
    peft = peft_principal(model_type, init, dora)
    start, frozen = member_state(ours, 0), member_frozen(ours, 0, method("lora", lora_init=init))
    for plain, module in lora_modules(peft):
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        assert_close_to_scale(start[f"{plain}.lora_a.weight"], a)
        assert_close_to_scale(start[f"{plain}.lora_b.weight"], b)
        if dora:  # PEFT's ‖W_res + s·B₀A₀‖ is ‖W‖ to rounding
            assert_close_to_scale(start[f"{plain}.magnitude"], module.lora_magnitude_vector["default"].weight)
    assert all(name.endswith(("lora_a0", "lora_b0")) for name in frozen) and len(frozen) == 2 * 2 * 2
    moved(ours)
    state = member_state(ours, 0)
    with torch.no_grad():
        for plain, module in lora_modules(peft):
            module.lora_A["default"].weight.copy_(state[f"{plain}.lora_a.weight"])
            module.lora_B["default"].weight.copy_(state[f"{plain}.lora_b.weight"])
            if dora:
                module.lora_magnitude_vector["default"].weight.copy_(state[f"{plain}.magnitude"])
    ours.train()
    peft.train()
    grads = same_logits_then_backward(model_type, ours, peft, tiny_encoder(model_type, dropout=0.0, **O1))
    counted = 0
    for plain, module in lora_modules(peft):
        pairs = [("lora_a.weight", module.lora_A["default"].weight), ("lora_b.weight", module.lora_B["default"].weight)]
        if dora:
            pairs.append(("magnitude", module.lora_magnitude_vector["default"].weight))
        for ours_name, parameter in pairs:
            assert_close_to_scale(grads[f"{plain}.{ours_name}"], parameter.grad, msg=f"{plain}.{ours_name}")
            counted += parameter.numel()
    assert parameter_counts(ours)["trainable_params"] == counted == 2 * 2 * (2 * 8 * H + (H if dora else 0))


class Block(torch.nn.Module):
    """One Linear holding rows of ModernBERT's Wqkv, for PEFT's init on that block alone."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.block = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.block.weight.copy_(weight)


@pytest.mark.parametrize("init", INITS)
def test_modernbert_blocks_start_as_peft_does_on_each_block(init):
    """On ModernBERT's Wqkv each block's A₀, B₀ (our A, B at the start) are PEFT's init of that block alone (PEFT itself
    would factor the whole Wqkv). The model against PEFT's LoRA of rank 2·2r on the original Wqkv, the form it is
    exported in: rows lora-pissa-modernbert ... of tests/test_peft_matrix.py."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    state = member_state(build("modernbert", method("lora", lora_init=init), **O1), 0)
    plain = tiny_encoder("modernbert", dropout=0.0, **O1)
    for index, layer in enumerate(plain.model.layers):
        for target, rows in (("query", slice(0, H)), ("value", slice(2 * H, 3 * H))):
            peft_block = get_peft_model(Block(layer.attn.Wqkv.weight[rows].detach().clone()),
                                        LoraConfig(r=8, lora_alpha=16, init_lora_weights=init, target_modules=["block"]))
            name = f"model.layers.{index}.attn.Wqkv.{target}"
            lora = peft_block.base_model.model.block
            assert_close_to_scale(state[f"{name}.lora_a.weight"], lora.lora_A["default"].weight)
            assert_close_to_scale(state[f"{name}.lora_b.weight"], lora.lora_B["default"].weight)
            assert (lora.lora_B["default"].weight @ lora.lora_A["default"].weight).abs().max() > 1e-2


def test_a_principal_member_starts_as_the_pretrained_model_and_trains_only_a_and_b():
    """At the start B A = B₀ A₀ exactly, so the model is the pretrained one; A₀, B₀ are buffers, never trained."""
    model = build("bert", method("lora", lora_init="pissa"), **O1)
    delta = model.layers[0].attention.self.query
    x = torch.randn(2, 5, H)
    torch.testing.assert_close(delta(x), delta.base(x), rtol=0, atol=0)
    assert not any("lora_a0" in name or "lora_b0" in name for name, _ in model.named_parameters())
    assert delta.lora_a0[0].abs().sum() > 0


def test_lora_init_kaiming_keeps_a_records_identity_and_pissa_is_another_run(tmp_path):
    """`lora_init: kaiming` (lora.yaml's) is left out of the identity: LoRA and DoRA records from before the setting keep
    their hash and folder; pissa and olora are other runs, in folders that say so."""
    for name in ("lora", "dora", "lora_fa"):
        plain = compose_config(f"method={name}", "task=rte")
        without = compose_config(f"method={name}", "task=rte", "~method.lora_init")
        assert config_hash(plain) == config_hash(without)
        assert record_path(plain, tmp_path) == record_path(without, tmp_path)
        pissa = compose_config(f"method={name}", "task=rte", "method.lora_init=pissa")
        assert config_hash(pissa) != config_hash(plain) != config_hash(
            compose_config(f"method={name}", "task=rte", "method.lora_init=olora"))
        assert record_path(pissa, tmp_path).parts[-5] == f"{name},lora_init=pissa"


def test_a_gated_or_unknown_init_is_one_line():
    from peltbench import UserError
    from peltbench.config import check_config

    with pytest.raises(UserError, match=r"method.lora_init=pissa: takes s·B₀A₀ out of W, and a gate replaces s"):
        check_config(compose_config("method=unipelt_apl", "task=rte", "+method.lora_init=pissa"))
    with pytest.raises(UserError, match="method.lora_init=gaussian: must be kaiming"):
        check_config(compose_config("method=lora", "task=rte", "method.lora_init=gaussian"))
    with pytest.raises(ValueError, match="PiSSA and OLoRA run ungated"):
        check_method(method("lora", lora_init="olora", gated=True))
    with pytest.raises(ValueError, match=r"lora_init=pissa takes lora_rank=40 principal directions of a 32 × 32"):
        build("bert", method("lora", lora_init="pissa", lora_rank=40), **O1)


MIXED = [("lora", {"lora_init": "pissa"}), ("lora", {}), ("lora", {"lora_init": "olora", "lora_rank": 4,
                                                                    "lora_targets": ["key", "value"]}),
         ("lora_fa", {"lora_init": "pissa", "lora_scale": 4.0}), ("road", {}), ("delora", {}),
         ("lora", {"lora_init": "pissa", "lora_rank": 2})]


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_mixing_inits_computes_each_members_logits_and_gradients(model_type):
    """PiSSA, OLoRA and kaiming LoRA members (ranks, scales, targets, LoRA-FA) beside RoAd and DeLoRA share one W: each
    member's logits and gradients equal its own model's, and each starts from its own model's A and B."""
    group, methods, seeds = mixed_group(model_type, MIXED, **O1)
    assert_members_start_as_their_own_models(model_type, group, methods, seeds, **O1)
    moved(group)
    with torch.no_grad():  # the padding of a smaller rank stays zero, as the group holds it
        for module in group.modules():
            if hasattr(module, "lora_a0") and module.lora_a0 is not None:
                for slot in module.users:
                    module.lora_a.weight[slot, methods[slot].lora_rank :] = 0
                    module.lora_b.weight[slot, :, methods[slot].lora_rank :] = 0
    assert_members_equal_their_own_models(model_type, group, methods, seeds, **O1)


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_a_pissa_run_alone_and_fused_saves_reloads_and_exports_peft_converted_form(model_type, tmp_path, glue_dir):
    """Through peltbench (dropout on): a PiSSA LoRA run fused with a kaiming LoRA and an OLoRA DoRA writes its separate
    run's record; load_run rescores it (A₀, B₀ computed again from W); peft/ is PEFT's converted form, a LoRA (DoRA) of
    rank 2r (ModernBERT: 2·2r on Wqkv) with lora_alpha = s·2r and the kaiming init flag, for the ORIGINAL model (that
    it loads there and predicts: rows lora-pissa, dora-olora ... of tests/test_peft_matrix.py)."""
    import json

    import peltbench
    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.1, **O1)  # alone = fused with dropout on
    extra = ("method.lr=5e-3", "save.weights=true", "method.lora_init=pissa")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["lora"], False, *extra))
    cfgs = [*sweep(checkpoint, glue_dir, tmp_path / "fused", ["lora"], True, "method.lr=5e-3"),
            *sweep(checkpoint, glue_dir, tmp_path / "fused", ["lora"], True, *extra),
            *sweep(checkpoint, glue_dir, tmp_path / "fused", ["dora"], True, "method.lr=5e-3", "save.weights=true",
                   "method.lora_init=olora")]
    fused = run_group(cfgs)
    assert [o.status for o in [alone, *fused]] == ["ok"] * 4 and fused[1].record["fused"]["size"] == 3
    assert_trained_alike(alone.record, fused[1].record)
    assert alone.record["variant"].startswith("lora,lora_init=pissa,") and alone.record["trainable_params"] == 2 * 2 * 2 * 8 * H
    rank = 32 if model_type == "modernbert" else 16
    for outcome, folder in ((alone, tmp_path / "alone"), (fused[2], tmp_path / "fused")):
        run_dir = next(folder.rglob(f"{outcome.record['variant']}/rte/k16/seed111"))
        config = json.loads((run_dir / "peft" / "adapter_config.json").read_text())
        assert (config["r"], config["lora_alpha"], config["init_lora_weights"]) == (rank, 2.0 * rank, True)
        assert config.get("use_dora", False) == (outcome is fused[2])
        loaded = peltbench.load_run(run_dir)
        assert loaded.predict()[0] == pytest.approx(outcome.record["test"], abs=1e-6)


def test_pissa_and_olora_members_train_fused_save_and_reload_in_bf16(glue_dir, tmp_path, as_on_a_gpu):
    """Under bf16 autocast with a GPU's batch shapes and DeviceCheck (tests/test_devices.py: lora_init is a setting, so
    that file's every-method tests do not reach it): a PiSSA LoRA, an OLoRA DoRA and a kaiming LoRA train as one group,
    and the PiSSA run reloads and rescores as it scored."""
    import math

    import peltbench
    import peltbench.runner as runner
    from conftest import save_tiny_encoder, tiny_run_overrides

    checkpoint = save_tiny_encoder("bert", tmp_path / "ckpt")
    common = ("task=rte", *tiny_run_overrides(checkpoint, glue_dir, tmp_path / "runs"), "precision=auto", "fuse=true")
    cfgs = [compose_config("method=lora", "method.lora_init=pissa", "save.weights=true", *common),
            compose_config("method=dora", "method.lora_init=olora", *common),
            compose_config("method=lora", *common)]
    outcomes = runner.run_group(cfgs)
    for outcome in outcomes:
        assert outcome.status == "ok", outcome.record.get("error")
        assert outcome.record["precision"] == "bf16" and outcome.record["fused"]["size"] == 3
        assert math.isfinite(outcome.record["test"]["main"])
    run_dir = next((tmp_path / "runs").glob("lora,lora_init=pissa*/rte/k16/seed111"))
    loaded = peltbench.load_run(run_dir)
    assert loaded.bf16 and loaded.predict()[0] == pytest.approx(outcomes[0].record["test"], abs=1e-6)
