"""Dropout that belongs to each run: every mask a member draws is a function of that run's own seeds, its own step,
the dropout site, the example and the position in it — never of the group it trains in.

A fused group trains many runs in one batch, so a dropout drawn from torch's one random stream would give each
member masks that depend on which runs sit beside it, how many rows they have and how a step is cut into pieces.
Here every mask is computed, not drawn: for one element of one site,

    keep = finish(mix(counter) ^ key[site, row]) >= p · 2³²

where `mix` is a 32-bit integer hash (two multiply-xorshift rounds, a bijection; `finish` is multiply, xorshift,
multiply: enough after the XOR of two hashed values, as the comparison reads the top bits), `counter` numbers the
element within its row (position and feature; for attention probabilities head, query and key, the key counted in the
member's own [prefix; tokens] order) independently of how far the batch is padded, and `key[site, row]` hashes the
run's model seed and data seed, its step, the example's index in the train split, and the site. The keys are computed
on the host with numpy (`key_table`), once per step; the masks on the device, for all members at once, with integer
tensor ops (no host sync, no loop over members). So a run's masks are the same alone, in any group, after a resume
that re-forms its group, in a group trained in parts, on any device: the same numbers, up to the float rounding of
batched matmuls.

Kept elements are scaled by 1/(1-p), as torch's dropout does; the keep rate is p to 2⁻³².
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

MASK32 = 0xFFFFFFFF
MULTIPLIER = 0x45D9F3B  # < 2²⁷: a 32-bit value times it never leaves int64, so the hash is exact on every device
POSITIONAL = MASK32  # the "example" of DeBERTa's relative embeddings (one block per member, not an example's)
FEATURE_BITS = 12    # counter of a hidden element: position << 12 | feature (features < 4,096)
QUERY_BITS = 11      # counter of an attention probability: head << 22 | query << 11 | key (positions < 2,048)


def mix(x):
    """A 32-bit integer hash of values in [0, 2³²): torch int64 tensors or numpy uint64 arrays alike."""
    x = x ^ (x >> 16)
    x = (x * MULTIPLIER) & MASK32
    x = x ^ (x >> 16)
    x = (x * MULTIPLIER) & MASK32
    return x ^ (x >> 16)


def finish(x: torch.Tensor) -> torch.Tensor:
    """The mask's hash of values already hashed (a hashed counter XOR a key): mix without its first and last xorshift,
    6 integer ops per element, in place on the fresh tensor `x`. A bijection, and the mask is cut from the top bits
    of the last product, which depend on every bit of its input."""
    x.mul_(MULTIPLIER).bitwise_and_(MASK32)
    x.bitwise_xor_(x >> 16)
    return x.mul_(MULTIPLIER).bitwise_and_(MASK32)


def row_salts(model_seed: int, data_seed: int, step: int, examples) -> np.ndarray:
    """One 32-bit value per row: the run's seeds, its step and each row's example index, hashed."""
    run = mix(np.uint64(model_seed & MASK32))
    run = mix(run ^ np.uint64(data_seed & MASK32))
    run = mix(run ^ np.uint64(step & MASK32))
    return mix(np.asarray(examples, dtype=np.uint64) ^ run)


def key_table(salts: np.ndarray, sites: int) -> np.ndarray:
    """key[site, row] for every dropout site of the model (sites, rows), as int64."""
    site_salts = mix(np.arange(1, sites + 1, dtype=np.uint64))
    return mix(salts[None, :] ^ site_salts[:, None]).astype(np.int64)


class Keys:
    """The dropout keys of one forward pass: (sites, rows) for the rows of the batch, (sites, members) for what comes
    one block per member (DeBERTa's relative embeddings)."""

    def __init__(self, rows: torch.Tensor, members: torch.Tensor) -> None:
        self.tables = {False: rows, True: members}
        self._shaped: dict[tuple[bool, int], torch.Tensor] = {}

    def at(self, site: int, positional: bool, dims: int) -> torch.Tensor:
        """A site's keys shaped (rows, 1, ...) to broadcast over `dims` trailing dimensions (one view per step)."""
        key = (positional, dims)
        if key not in self._shaped:
            table = self.tables[positional]
            self._shaped[key] = table.view(*table.shape, *[1] * dims)
        return self._shaped[key][site]


def step_keys(settings, active: list[int], step: int, examples: list[list[int]], sites: int,
              device: torch.device) -> Keys:
    """The keys of one training step (or piece of one): `settings[m]` has member m's `seed` (model seed) and
    `data_seed`; `examples[i]` are the train-split indices of the i-th active member's rows, in batch order."""
    rows = np.concatenate([row_salts(settings[m].seed, settings[m].data_seed, step, chosen)
                           for m, chosen in zip(active, examples)])
    members = np.concatenate([row_salts(settings[m].seed, settings[m].data_seed, step, [POSITIONAL]) for m in active])
    table = torch.from_numpy(np.concatenate([key_table(rows, sites), key_table(members, sites)], axis=1))
    if device.type == "cuda":  # an asynchronous copy: the step does not wait for the work queued before it
        table = table.pin_memory()
    table = table.to(device, non_blocking=True)
    return Keys(table[:, : len(rows)], table[:, len(rows) :])


def default_keys(rows: int, members: int, sites: int, device: torch.device) -> Keys:
    """Keys for a training-mode forward outside the training loop: step 0 of seed 0, rows numbered in order."""
    table = key_table(row_salts(0, 0, 0, np.arange(rows)), sites)
    member_table = key_table(row_salts(0, 0, 0, np.full(members, POSITIONAL)), sites)
    return Keys(torch.from_numpy(table).to(device), torch.from_numpy(member_table).to(device))


class _Counters:
    """mix(counter) for the elements of a row, computed once for the largest shape seen and sliced for smaller ones
    (a batch padded less is a prefix of the positions, so the counters are the same)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, torch.Tensor] = {}

    def hidden(self, positions: int, features: int, device: torch.device) -> torch.Tensor:
        key = ("hidden", features, device)
        table = self._cache.get(key)
        if table is None or table.shape[0] < positions:
            rows = torch.arange(max(positions, 128), device=device, dtype=torch.int64)
            table = mix((rows[:, None] << FEATURE_BITS) | torch.arange(features, device=device, dtype=torch.int64))
            self._cache[key] = table
        return table[:positions]

    def attention(self, heads: int, queries: int, keys: int, device: torch.device) -> torch.Tensor:
        key = ("attention", heads, device)
        table = self._cache.get(key)
        if table is None or table.shape[1] < queries or table.shape[2] < keys:
            size = max(queries, keys, 128, 0 if table is None else table.shape[1])
            head = torch.arange(heads, device=device, dtype=torch.int64)[:, None, None] << (2 * QUERY_BITS)
            query = torch.arange(size, device=device, dtype=torch.int64)[None, :, None] << QUERY_BITS
            table = mix(head | query | torch.arange(size, device=device, dtype=torch.int64))
            self._cache[key] = table
        return table[:, :queries, :keys]


COUNTERS = _Counters()


def keep_mask(mixed_counters: torch.Tensor, keys: torch.Tensor, p: float) -> torch.Tensor:
    """Which elements survive: keys (rows, 1, ...) against the rows' counters (any trailing shape)."""
    return finish(mixed_counters ^ keys) >= int(p * 2**32)


def drop(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """x times its kept elements' scale 1/(1-p): one product for autograd (its backward is one product too)."""
    return x * (keep * (1.0 / (1.0 - p)))


class MemberDropout(nn.Module):
    """nn.Dropout with each member's own masks (see the module's docstring); identity in evaluation or at p = 0."""

    def __init__(self, members, p: float, site: int) -> None:
        super().__init__()
        self.members, self.p, self.site = members, float(p), site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.dim() == 2:  # (rows, features): the classification head's input
            counters = COUNTERS.hidden(1, x.shape[-1], x.device)[0]
        else:             # (rows, positions, features)
            counters = COUNTERS.hidden(x.shape[1], x.shape[-1], x.device)
        keys = self.members.dropout_keys(self.site, x.device, counters.dim())
        return drop(x, keep_mask(counters, keys, self.p), self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}, site={self.site}"


def attention_keep_mask(module, heads: int, queries: int, keys: int, p: float, device: torch.device,
                        rows: slice | torch.Tensor | None = None) -> torch.Tensor:
    """The keep mask of a layer's attention probabilities (rows, heads, queries, keys) for the rows attended now (a
    class of members with one prefix length: `rows` picks their keys)."""
    table = module.peltbench_members.dropout_keys(module.peltbench_site, device, 3)
    if rows is not None:
        table = table[rows] if isinstance(rows, slice) else table.index_select(0, rows)
    return keep_mask(COUNTERS.attention(heads, queries, keys, device), table, p)


def install(model) -> int:
    """Give every dropout of the model its member's own masks: each nn.Dropout of the backbone and the head becomes a
    MemberDropout, and each layer's attention probabilities get a site (methods/attention.py). Returns the number of
    sites. Sites are numbered in the model's own module order, so a run's sites are the same in every group."""
    site = 0
    for layer in model.layers:
        attention = model.attention(layer)
        attention.peltbench_site, attention.peltbench_members = site, model.members
        site += 1
    for module in [model.backbone, model.head]:
        for parent in list(module.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Dropout):
                    setattr(parent, name, MemberDropout(model.members, child.p, site))
                    site += 1
    return site
