"""RoAd (methods/road.py): its rotation, its refusals, in fused groups, under successive halving, through peltbench,
saved and reloaded. Against PEFT 0.21's RoAd (every variant, three group sizes, every encoder; its export and counts):
rows road-* of tests/test_peft_matrix.py.

Tiny random encoders with O(1) weights (initializer_range 0.2), θ and α moved off their identity start so that every
factor of the rotation matters. Tolerances as tests/test_encoders.py: 1e-5 relative / 1e-6 absolute.
"""

from __future__ import annotations

import pytest
import torch

from peltbench.methods import member_state
from test_encoders import (assert_a_mixed_group_is_its_members_alone, assert_fused_as_alone, build, method, normal,
                           off_start, reloaded)

O1 = {"initializer_range": 0.2}
H = 32  # the tiny encoders' hidden size: q, k, v are H × H (ModernBERT: H-row blocks of Wqkv)


def turned(model) -> None:
    """θ and α away from 0 and 1, so that the rotation is not the identity."""
    off_start(model, 6, {"road_theta": normal(0.7), "road_alpha": normal(0.3, mean=1)})


def test_road_starts_as_the_pretrained_model_and_rotates_pairs():
    """θ = 0, α = 1: the identity (bit for bit on the projection); with θ = π/2 and α = 1 on one pair of road_1,
    group 2, the pair (h_0, h_1) becomes (−h_1, h_0) and nothing else moves."""
    model = build("bert", method("road"), **O1)
    road = model.layers[0].attention.self.query
    x = torch.randn(2, 5, H)
    plain = road.base(x)
    torch.testing.assert_close(road(x), plain, rtol=0, atol=0)
    with torch.no_grad():
        road.road_theta[0, 0] = torch.pi / 2
    expected = plain.clone()
    expected[..., 0], expected[..., 1] = -plain[..., 1], plain[..., 0]
    torch.testing.assert_close(road(x), expected, rtol=1e-6, atol=1e-6)


def test_a_group_size_that_does_not_pair_the_outputs_is_one_line(tmp_path):
    """PEFT's rule (the group size divides every adapted Linear's outputs: H, the FFN's width, ModernBERT's GLU's
    2 × its width) before torch for a local checkpoint, and at build time."""
    from conftest import compose_config, save_tiny_encoder
    from peltbench import UserError
    from peltbench.config import check_config
    from peltbench.methods import check_method

    checkpoint = save_tiny_encoder("bert", tmp_path / "ckpt")
    glu = save_tiny_encoder("modernbert", tmp_path / "glu")
    with pytest.raises(UserError, match=r"road_group_size=64 must divide the output size of every Linear RoAd adapts: "
                                        r"query has 32 \(bert hidden_size 32\)"):
        check_config(compose_config("method=road", "task=rte", f"model.name={checkpoint}", "method.road_group_size=64"))
    with pytest.raises(ValueError, match="road_group_size=64 must divide the output size of every Linear RoAd adapts: "
                                         "query has 32"):
        build("bert", method("road", road_group_size=64), **O1)
    fc1 = ("method=road", "task=rte", "method.road_targets=[intermediate]")  # the paper's RoAd1(fc1)
    with pytest.raises(UserError, match=r"intermediate has 64 \(bert intermediate_size 64\)"):
        check_config(compose_config(*fc1, f"model.name={checkpoint}", "method.road_group_size=128"))
    check_config(compose_config(*fc1, f"model.name={glu}", "method.road_group_size=128"))  # Wi: 2 · 64 outputs
    with pytest.raises(UserError, match=r"intermediate has 128 \(modernbert mlp.Wi: 2 × intermediate_size 64, a GLU"):
        check_config(compose_config(*fc1, f"model.name={glu}", "method.road_group_size=256"))
    with pytest.raises(ValueError, match="intermediate has 64"):
        build("bert", method("road", road_group_size=128, road_targets=["intermediate"]), **O1)
    with pytest.raises(UserError, match="method.road_targets=.*must be a list of distinct Linears of a layer"):
        check_config(compose_config("method=road", "task=rte", "method.road_targets=[query,pooler]"))
    with pytest.raises(UserError, match="method.road_variant=3: must be 1, 2 or 4"):
        check_config(compose_config("method=road", "task=rte", "method.road_variant=3"))
    with pytest.raises(UserError, match="method.road_group_size=5: must be a positive even integer"):
        check_config(compose_config("method=road", "task=rte", "method.road_group_size=5"))
    with pytest.raises(ValueError, match="component road has no gate"):
        check_method(method("road", components=["road", "adapter"], gated=True, bottleneck=8))


def test_road_adapts_every_linear_of_a_layer_by_default():
    """The paper's targets (conf/method/road.yaml): q, k, v, the attention output and both FFN Linears of each layer
    (ModernBERT: Wqkv's three blocks, attn.Wo, the GLU's mlp.Wi, mlp.Wo), and nothing of the head."""
    from peltbench.methods.road import RoAdLinear

    for model_type, linears in (("roberta", ["attention.self.query", "attention.self.key", "attention.self.value",
                                             "attention.output.dense", "intermediate.dense", "output.dense"]),
                                ("modernbert", ["attn.Wqkv.query", "attn.Wqkv.key", "attn.Wqkv.value", "attn.Wo",
                                                "mlp.Wi", "mlp.Wo"])):
        model = build(model_type, method("road"), **O1)
        adapted = [model.stored_name(n) for n, m in model.named_modules() if isinstance(m, RoAdLinear)]
        prefix = {"roberta": "roberta.encoder.layer", "modernbert": "model.layers"}[model_type]
        assert adapted == [f"{prefix}.{layer}.{linear}" for layer in (0, 1) for linear in linears]


MIXED = [("road", {}), ("road", {"road_variant": 4, "road_group_size": 8}), ("delora", {}),
         ("road", {"road_variant": 2, "road_targets": ["key"]}), ("lora", {}), ("oft", {"oft_block_size": 8}),
         ("road", {"road_group_size": 16, "road_targets": ["intermediate", "output"]}), ("ia3", {}),
         ("adalora", {}), ("adapter", {}), ("bitfit", {})]  # other wrappers of the FFN's and attention output's Linears


@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "modernbert"])
def test_a_group_with_road_and_other_methods_computes_each_members_logits_and_gradients(model_type):
    """RoAd members of every variant, group size and target beside DeLoRA, LoRA, OFT, (IA)³, and AdaLoRA, the adapter
    and BitFit on the same FFN and attention-output Linears, on one backbone: each member's logits and gradients equal
    its own model's, and each starts from its own model's values."""
    from test_delora import spread

    assert_a_mixed_group_is_its_members_alone(model_type, MIXED, [turned, spread], **O1)


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_road_runs_alone_and_fused_saves_and_reloads(model_type, tmp_path, glue_dir):
    """Through peltbench (dropout on): RoAd fused with DeLoRA and LoRA gives its separate run's record;
    save.weights=true keeps θ and α and writes peft/ (PEFT's RoadConfig; that it loads and predicts: the matrix);
    load_run predicts what the run scored."""
    import json

    from conftest import save_tiny_encoder
    from peltbench.runner import run_group
    from test_encoders import sweep

    checkpoint = save_tiny_encoder(model_type, tmp_path / "ckpt", dropout=0.1, **O1)  # alone = fused with dropout on
    extra = ("method.lr=5e-2", "save.weights=true")
    [alone] = run_group(sweep(checkpoint, glue_dir, tmp_path / "alone", ["road"], False, *extra))
    fused = run_group(sweep(checkpoint, glue_dir, tmp_path / "fused", ["delora", "road", "lora"], True, *extra))
    assert_fused_as_alone(alone, fused, 3)
    assert alone.record["trainable_params"] == 2 * (5 * H + (4 if model_type == "modernbert" else 2) * H)
    run_dir, loaded = reloaded(tmp_path / "alone", alone)
    config = json.loads((run_dir / "peft" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["variant"], config["group_size"]) == ("ROAD", "road_1", 2)
    assert any((t - 1).abs().max() > 1e-3 for n, t in member_state(loaded.model, 0).items() if n.endswith("road_alpha"))
