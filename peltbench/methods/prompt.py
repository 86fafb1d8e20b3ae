"""Prompt tuning (Lester et al. 2021): P trainable input embeddings prepended to every example's word embeddings.

    inputs_embeds = [P_1 … P_P ; E(x_1) … E(x_T)]       P: (P, E), E the word embeddings' width (H on a base model)
exactly as PEFT's PeftModelForSequenceClassification handles a prompt (peft/peft_model.py): the prompts go in front
of the word embeddings, the attention mask gets P ones in front, token type ids (where the encoder takes them) P
zeros, and no position ids are passed, so the encoder numbers all P + T positions itself (the prompts take the first
positions and the tokens follow; DeBERTa's relative positions count them too). The embeddings module then adds
positions and token types and normalises, as for any token. The head pools what the model pools: BERT's pooler and
RoBERTa's / DeBERTa's / ELECTRA's first position is then the first virtual token; ModernBERT's mean runs over the
prompts too.

Init (`prompt_init`): `vocab`, PEFT's SAMPLE_VOCAB (the word embeddings of P token ids drawn uniformly from the
vocabulary; Lester et al. §3 sample from the 5,000 most common tokens); `random`, PEFT's RANDOM (nn.Embedding's
N(0, 1)).

A fused group's members all have one prompt length (peltbench.fusion groups prompt runs by it), so every row has
the same P + T positions; each member's rows get its own prompts.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from ..component import Component, POSITIVE_INT, Peft, Positions, Setting, choice
from .base import Members, PeltModel, draw, mark

COMPONENT = Component(
    stage="input",
    settings={
        "prompt_length": Setting(POSITIVE_INT, "prompt tuning's number of prompt embeddings P"),
        "prompt_init": Setting(choice("vocab", "random", must="must be vocab (sampled word embeddings) or random "
                                                             "(N(0, 1))"),
                               "prompt tuning's init: vocab (sampled word embeddings) or random (N(0, 1))"),
    },
    positions=Positions("prompt_length"),
    group_by=("prompt_length",),  # the prompts shift every token's position: a fused group has one length
    label="Prompt tuning", arxiv="2104.08691", peft=Peft("PROMPT_TUNING"),
)  # no gate: the prompts are inputs, not an additive contribution to a frozen path
INITS = ("vocab", "random")


class Prompt(nn.Module):
    """Each member's P prompt embeddings (`embedding`: members, P, E); forward puts the active members' prompts in
    front of their rows' word embeddings and widens the mask and token types to match."""

    def __init__(self, members: Members, length: int, width: int, device: torch.device) -> None:
        super().__init__()
        self.members = members
        self.length = length
        self.embedding = nn.Parameter(torch.zeros(members.count, length, width, device=device))

    def forward(self, encoder: nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        words = encoder.get_input_embeddings()(ids)
        prompts = self.members.pick(self.embedding).to(words.dtype)  # (active members, P, E)
        rows = words.shape[0] // prompts.shape[0]
        prompts = prompts[:, None].expand(-1, rows, -1, -1).reshape(-1, self.length, words.shape[-1])
        widened = {"inputs_embeds": torch.cat([prompts, words], dim=1),
                   "attention_mask": torch.cat([mask.new_ones(mask.shape[0], self.length), mask], dim=1)}
        if "token_type_ids" in inputs:
            types = inputs["token_type_ids"]
            widened["token_type_ids"] = torch.cat([types.new_zeros(types.shape[0], self.length), types], dim=1)
        return widened

    def init_member(self, slot: int, method: DictConfig, words: nn.Embedding) -> None:
        if method.prompt_init == "random":  # nn.Embedding's own init, as PEFT's RANDOM
            draw(self.embedding[slot], nn.init.normal_)
            return
        ids = torch.randint(0, words.num_embeddings, (self.length,), dtype=torch.long)  # PEFT's SAMPLE_VOCAB
        with torch.no_grad():
            self.embedding[slot].copy_(words.weight[ids.to(words.weight.device)].detach())


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    lengths = {users[m].prompt_length if m in users else 0 for m in range(model.members.count)}
    if len(lengths) > 1:
        raise ValueError("prompt tuning: a group's members must all have one prompt length (the prompts shift every "
                         "token's position); peltbench.fusion groups prompt runs by their length")
    words = model.encoder.get_input_embeddings()
    model.prompt = Prompt(model.members, lengths.pop(), words.embedding_dim, words.weight.device)
    model.input_stages.append(_prompts_in_front)
    mark(model, model.prompt, users)


def _prompts_in_front(model: PeltModel, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every row then has P more positions, the mask included (PeltModel.forward reads the widened mask)."""
    return model.prompt(model.encoder, inputs)


def added_tokens(method: DictConfig) -> int:
    """Positions each row gains (runner.memory_cap: the activations grow with them)."""
    return int(method.prompt_length)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    model.prompt.init_member(slot, method, model.encoder.get_input_embeddings())


def check(method: DictConfig) -> None:
    if method.prompt_init not in INITS:
        raise ValueError(f"prompt_init must be one of {list(INITS)}, not {method.prompt_init!r}")
