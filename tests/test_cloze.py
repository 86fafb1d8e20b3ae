"""objective=cloze: the logits and the loss at the mask equal LM-BFF's `BertForPromptFinetuning` /
`RobertaForPromptFinetuning` forward (princeton-nlp/LM-BFF c282f521, src/models.py), the regression path included, on
tiny models with O(1) weights (peltbench/tiny.py).

Their models target transformers 3.4; the forward's arithmetic is ported below (`lmbff_forward`, line for line from
src/models.py) and run on a copy of the same `*ForMaskedLM`: the encoder (`self.bert` / `self.roberta`), the mask
row, the whole-vocabulary scores of their head (`self.cls` / `self.lm_head`: transformers 5's are the same modules),
the label words' columns, log-softmax and `nn.KLDivLoss(log_target=True)` for a regression, cross-entropy otherwise.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from peltbench.methods import build_pelt_model
from peltbench.methods.base import Cloze
from peltbench.packaged import packaged_config
from peltbench.tasks import TaskSpec
from peltbench.templates import label_word_ids, tokenize_multipart_input
from peltbench.tiny import tiny_masked_lm, tiny_tokenizer
from peltbench.train import member_losses, predicted

LB, UB = 0.0, 5.0  # LM-BFF's bound_mapping["sts-b"], STS-B's label_range


def lmbff_forward(reference, input_ids, attention_mask, mask_pos, labels, label_word_list, num_labels):
    """src/models.py, BertForPromptFinetuning.forward / RobertaForPromptFinetuning.forward (c282f52), on a
    transformers-5 `*ForMaskedLM` (`reference`): (loss, logits, output)."""
    encoder = reference.base_model
    head = reference.cls if hasattr(reference, "cls") else reference.lm_head
    mask_pos = mask_pos.squeeze()
    outputs = encoder(input_ids, attention_mask=attention_mask)  # token_type_ids: never passed (templates.py)
    sequence_output = outputs[0]
    sequence_mask_output = sequence_output[torch.arange(sequence_output.size(0)), mask_pos]
    prediction_mask_scores = head(sequence_mask_output)
    logits = []
    for label_id in range(len(label_word_list)):
        logits.append(prediction_mask_scores[:, label_word_list[label_id]].unsqueeze(-1))
    logits = torch.cat(logits, -1)
    if num_labels == 1:
        logits = nn.LogSoftmax(-1)(logits)
    if num_labels == 1:
        loss_fct = nn.KLDivLoss(log_target=True)
        labels = torch.stack([1 - (labels.view(-1) - LB) / (UB - LB), (labels.view(-1) - LB) / (UB - LB)], -1)
        loss = loss_fct(logits.view(-1, 2), labels)
    else:
        loss = nn.CrossEntropyLoss()(logits.view(-1, logits.size(-1)), labels.view(-1))
    output = torch.exp(logits[..., 1].unsqueeze(-1)) * (UB - LB) + LB if num_labels == 1 else logits
    return loss, logits, output


def task_spec(name: str) -> TaskSpec:
    return TaskSpec.from_config(packaged_config(f"task/{name}.yaml"))


ROWS = [["the movie was very good", "a man runs"], ["a bad film", "the dog sleeps on the mat"],
        ["this is not happy", "the woman sat"], ["it was a big red car", "not the small blue house"]]


def batch(model_type: str, template: str, texts_per_row: int):
    tokenizer = tiny_tokenizer(model_type)
    rows = [tokenize_multipart_input(row[:texts_per_row], 32, tokenizer, template) for row in ROWS]
    width = max(len(row.input_ids) for row in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row.input_ids)], mask[i, :len(row.input_ids)] = torch.tensor(row.input_ids), 1
    return tokenizer, ids, mask, torch.tensor([[row.mask_pos] for row in rows])


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("regression", [False, True])
@pytest.mark.filterwarnings("ignore:reduction. .mean. divides")
def test_logits_and_loss_equal_lmbffs_forward(model_type, regression):
    template = "*cls**sent_0**mask*,*+sentl_1**sep+*" if regression else "*cls**sent_0*_It_was*mask*.*sep+*"
    tokenizer, ids, mask, mask_pos = batch(model_type, template, 2 if regression else 1)
    words = label_word_ids({0: "bad", 1: "good"}, tokenizer, ["0", "1"])
    labels = torch.tensor([4.2, 0.5, 2.5, 5.0]) if regression else torch.tensor([1, 0, 0, 1])
    task = task_spec("stsb" if regression else "sst2")
    masked_lm = tiny_masked_lm(model_type, dropout=0.0)
    reference = copy.deepcopy(masked_lm)
    loss, logits, output = lmbff_forward(reference, ids, mask, mask_pos, labels, words, 1 if regression else 2)
    method = OmegaConf.create(packaged_config("method/ft.yaml"))
    model = build_pelt_model(masked_lm, method, 42, cloze=Cloze((tuple(words),), tokenizer.mask_token_id, regression))
    ours = model.eval()(ids, mask)
    assert logits.abs().max() > 0.5  # O(1) logits: a wrong row or head would show
    torch.testing.assert_close(ours, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(member_losses(ours, labels, 1, task)[0], loss, rtol=1e-5, atol=1e-6)
    expected = (output[:, 0] if regression else logits.argmax(-1)).detach().numpy()
    assert predicted(ours.detach().numpy(), task) == pytest.approx(expected, rel=1e-5)


def test_the_gradient_reaches_what_lmbff_trains():
    """ft + cloze (LM-BFF's `prompt`): the encoder, the head's transform and the label words' rows all train."""
    tokenizer, ids, mask, _ = batch("bert", "*cls**sent_0*_It_was*mask*.*sep+*", 1)
    words = label_word_ids({0: "bad", 1: "good"}, tokenizer, ["0", "1"])
    method = OmegaConf.create(packaged_config("method/ft.yaml"))
    model = build_pelt_model(tiny_masked_lm("bert"), method, 42, cloze=Cloze((tuple(words),), tokenizer.mask_token_id))
    member_losses(model.train()(ids, mask), torch.tensor([1, 0, 0, 1]), 1, task_spec("sst2")).sum().backward()
    grads = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"head.out.weight", "head.out.bias", "backbone.cls.predictions.transform.dense.weight",
            "backbone.bert.embeddings.word_embeddings.weight"} <= grads
    assert not hasattr(model.backbone.cls.predictions, "decoder")  # the vocabulary projection is never computed


def cloze_model(model_type: str, name: str, template: str = "*cls**sent_0*_It_was*mask*.*sep+*", **changes):
    from conftest import TINY_METHOD_SETTINGS

    tokenizer, ids, mask, mask_pos = batch(model_type, template, 1)
    words = label_word_ids({0: "bad", 1: "good"}, tokenizer, ["0", "1"])
    method = OmegaConf.create(OmegaConf.to_container(packaged_config(f"method/{name}.yaml")))
    for key, value in {**TINY_METHOD_SETTINGS.get(name, {}), **changes}.items():
        method[key] = value
    model = build_pelt_model(tiny_masked_lm(model_type), method, 42,
                             cloze=Cloze((tuple(words),), tokenizer.mask_token_id))
    return model, ids, mask, mask_pos, words


METHODS = sorted(path.stem for path in (Path(__file__).parents[1] / "conf" / "method").glob("*.yaml"))


@pytest.mark.parametrize("name", METHODS)
def test_every_method_trains_under_the_cloze_objective(name):
    """Each packaged method on a tiny masked-LM BERT: the label words' logits, and a gradient on exactly what the
    method trains (its head setting: the label words' rows and biases, their biases, or nothing)."""
    model, ids, mask, _, _ = cloze_model("bert", name)
    logits = model.train()(ids, mask)
    assert logits.shape == (4, 2)
    member_losses(logits, torch.tensor([1, 0, 0, 1]), 1, task_spec("sst2")).sum().backward()
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad), name
    head = packaged_config(f"method/{name}.yaml").head
    assert {"train": {"head.out.weight", "head.out.bias"}, "bias": {"head.out.bias"}, "frozen": set()}[head] == \
        {n for n in trained if n.startswith("head.")}


def test_prompt_tuning_moves_the_mask_by_its_prompts():
    """Prompt tuning puts P embeddings in front: the mask's hidden state is then P positions later."""
    model, ids, mask, mask_pos, words = cloze_model("bert", "prompt", prompt_length=3)
    model.eval()
    encoder, head = model.backbone.bert, model.backbone.cls.predictions.transform
    prompts = model.prompt.embedding[0].detach().expand(ids.shape[0], -1, -1)
    embeds = torch.cat([prompts, encoder.get_input_embeddings()(ids)], dim=1)
    wide = torch.cat([torch.ones(ids.shape[0], 3, dtype=mask.dtype), mask], dim=1)
    hidden = encoder(inputs_embeds=embeds, attention_mask=wide).last_hidden_state
    at_mask = head(hidden[torch.arange(ids.shape[0]), mask_pos.squeeze(1) + 3])
    expected = at_mask @ model.head.out.weight[0].T + model.head.out.bias[0]
    torch.testing.assert_close(model(ids, mask), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["roberta", "electra", "modernbert"])
def test_every_architecture_with_a_masked_lm_head_scores_its_label_words(model_type):
    """The architecture map's masked-LM head (architectures.MaskedLM) gives what the model's own *ForMaskedLM gives
    at the mask, for the label words' columns."""
    model, ids, mask, mask_pos, words = cloze_model(model_type, "lora")
    reference = tiny_masked_lm(model_type)
    full = reference(input_ids=ids, attention_mask=mask).logits
    expected = full[torch.arange(ids.shape[0]), mask_pos.squeeze(1)][:, list(words)]
    torch.testing.assert_close(model.eval()(ids, mask), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method_name", ["lora", "ft"])
def test_a_cloze_step_dispatches_no_more_operators_than_a_classifier_step(method_name):
    """The issue's cost target, as operators (what a GPU launches): the same method, rows and loop, one training step
    each (scripts/benchmark_cloze.py, here on a tiny shape with BERT's vocabulary)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from benchmark_cloze import step_of
    from benchmark_fused import OperatorCount

    counts = {}
    for objective in ("classifier", "cloze"):
        for size in (1, 3) if method_name != "ft" else (1,):  # alone; fused, 3 runs (ft trains alone)
            step = step_of(objective, "tiny", method_name, batch=8, length=20, size=size)
            step()
            with OperatorCount() as count:
                step()
            counts[objective, size] = count.count
    assert counts["cloze", 1] <= counts["classifier", 1], counts
    if method_name != "ft":  # a fused group's step dispatches what one run's does (its members' head rows stacked)
        assert counts["cloze", 3] == counts["cloze", 1] and counts["classifier", 3] == counts["classifier", 1], counts
