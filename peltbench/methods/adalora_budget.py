"""AdaLoRA's budget: the importance EMA, the cubic schedule, the masking of triplets, and the orthogonal regulariser,
as PEFT 0.21's RankAllocator and AdaLoraModel.update_and_allocate / forward compute them, for every member at once.

Per member m, with T its planned steps (epochs × batches per epoch, early stopping or not), t_i = round(tinit · T),
t_f = round(tfinal · T), and b₀ = r₀ · (its adapted matrices), b_T = r_T · (its adapted matrices):
    s < T − t_f:  update the importance EMA; s ≤ t_i: no masking; else
                  b(s) = ⌊(b₀ − b_T)(1 − (s − t_i)/(T − t_f − t_i))³ + b_T⌋, and on every Δt-th step the
                  b₀ − b(s) triplets of least importance (over all its matrices) get Λ = 0
    s = T − t_f:  mask to b_T, keep that rank pattern, forget the EMA
    s > T − t_f:  re-apply the kept pattern after every step
Importance of a triplet i of a matrix: S(Λᵢ) + mean_j S(Q_ij) + mean_j S(P_ji), S = Ī · Ū, Ī the EMA (β₁) of
|w · ∂L/∂w| and Ū the EMA (β₂) of |I − Ī|, with the gradients of the step just taken (after clipping, as a Trainer
has them). Everything is member-stacked, and batched over the matrices too: a step's importance update is a dozen
`torch._foreach_*` operators over every P, Λ, Q of the model, the scores and masks one operation per kind of tensor
and shape (usually five: Q of the FFN's output and of the rest, Λ, P of the FFN's input and of the rest), and the
regulariser one pair of batched products per shape; no operator is per member or per matrix, and nothing waits on the
device (the budgets come from the step number, on the host).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from .base import Members, to_device

A, E, B = 0, 1, 2  # a module's triplets(): lora_A (Q), lora_E (Λ), lora_B (P)


class Budget:
    """The budget state of a model's AdaLoRA members (`modules`: every SVDLinear, `users`: member → method).

    Tensors of one kind (A, E, B) and one shape are handled together (`groups`): their importance state is one
    tensor (matrices of the group, members, ...), of which each parameter's state is a view. Scores and masks are
    (matrices, members, R), R the largest rank, +inf (never masked) past a matrix's rank. "Members" here are the
    slots from the first AdaLoRA member to the last (`first`, `width`): in a mixed group the state is not kept for
    the others."""

    def __init__(self, modules: list, users: dict[int, DictConfig], count: int) -> None:
        self.modules = modules
        self.users = dict(users)
        self.count = count
        matrices = [sum(m in module.users for module in modules) for m in range(count)]
        self.init_budget = {m: int(method.adalora_init_rank) * matrices[m] for m, method in users.items()}
        self.target_budget = {m: int(method.adalora_target_rank) * matrices[m] for m, method in users.items()}
        self.matrices = matrices
        self.rank = max(module.rank_mask.shape[1] for module in modules)
        self.first, self.width = min(users), max(users) + 1 - min(users)
        self.slots = list(range(self.first, self.first + self.width))
        self.kept = self._rank_mask()  # (matrices, members, R): triplets not masked (plan)
        self.state: list[dict[str, torch.Tensor]] | None = None  # per parameter, views into `_state`
        self._state: list[dict[str, torch.Tensor]] | None = None  # per group
        self.schedule: dict[int, tuple[int, int, int]] = {}  # member → (T, t_i, t_f)
        groups: dict[tuple, list[int]] = {}
        for index, module in enumerate(modules):
            for kind, parameter in enumerate(module.triplets()):
                groups.setdefault((kind, tuple(parameter.shape)), []).append(index)
        self.groups = [(kind, indices) for (kind, _), indices in groups.items()]
        self._cache: dict[tuple, object] = {}

    def parameters(self) -> list[torch.Tensor]:
        """Every P, Λ, Q, in the order of the groups (the order of `state`)."""
        return [self.modules[i].triplets()[kind] for kind, indices in self.groups for i in indices]

    def _rank_mask(self, every: bool = False) -> torch.Tensor:
        """(matrices, members, R): each member's own triplets of each matrix (`every` member slot, or the span)."""
        mask = torch.stack([F.pad(module.rank_mask, (0, self.rank - module.rank_mask.shape[1]))
                            for module in self.modules])
        return mask if every else self._span(mask, 1)

    def _spans(self, parameters: list[torch.Tensor]) -> list[torch.Tensor]:
        """The parameters' slots of the span: views made once (while the parameters keep their storage)."""
        key = ("spans", tuple(p.data_ptr() for p in parameters))
        if key not in self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[0] != "spans"}
            self._cache[key] = [self._span(p) for p in parameters]
        return self._cache[key]

    def _span(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """A member-stacked tensor's slots of the AdaLoRA span (the tensor itself where that is every slot)."""
        return tensor if self.width == self.count else tensor.narrow(dim, self.first, self.width)

    def plan(self, total_steps: list[int]) -> None:
        """Each member's schedule from its planned number of steps (PEFT's total_step). Training starts with every
        triplet kept, on the device the model now trains on (the budget was made with the model, before it moved)."""
        self.kept = self._rank_mask()
        self._cache = {}
        for m, method in self.users.items():
            total = int(total_steps[m])
            tinit, tfinal = round(float(method.adalora_tinit) * total), round(float(method.adalora_tfinal) * total)
            if tinit >= total - tfinal:
                raise ValueError(f"adalora: {total} training steps leave no budgeting phase after tinit "
                                 f"{method.adalora_tinit} and before tfinal {method.adalora_tfinal} (of the steps); "
                                 "train longer or lower them")
            self.schedule[m] = (total, tinit, tfinal)

    def budget(self, m: int, step: int) -> tuple[int, bool]:
        """PEFT's budget_schedule: the member's budget at `step`, and whether to mask to it now."""
        total, tinit, tfinal = self.schedule[m]
        if step <= tinit:
            return self.init_budget[m], False
        if step > total - tfinal:
            return self.target_budget[m], True
        factor = 1 - (step - tinit) / (total - tfinal - tinit)
        budget = int((self.init_budget[m] - self.target_budget[m]) * (factor**3) + self.target_budget[m])
        return budget, step % int(self.users[m].adalora_delta_t) == 0

    @torch.no_grad()
    def after_step(self, step: int, active: list[int]) -> None:
        """PEFT's update_and_allocate(step) for every active member, after the optimiser step, before zero_grad.
        What each member does at this step is decided on the host from the step number alone."""
        update, reapply, reset, masking = [], [], [], {}
        for m in active:
            if m not in self.users:
                continue
            total, _, tfinal = self.schedule[m]
            if step < total - tfinal:
                update.append(m)
                budget, mask = self.budget(m, step)
                if mask:
                    masking[m] = budget
            elif step == total - tfinal:
                masking[m] = self.target_budget[m]
                reset.append(m)
            else:
                reapply.append(m)
        if update:
            self._update_importance(update)
        if masking:
            self._mask_to_budget(masking)
        if masking or reapply:
            self._apply([*masking, *reapply])
        if reset:
            self._reset(reset)

    def _members(self, values: list, device, dtype=torch.float32) -> torch.Tensor:
        """A small tensor made once per distinct list of values (a schedule repeats them), on the device."""
        key = ("values", tuple(values), device, dtype)
        if key not in self._cache:
            self._cache[key] = to_device(torch.tensor(values, dtype=dtype), device)
        return self._cache[key]

    def _betas(self, members: list[int], device) -> list[torch.Tensor]:
        """β₁, 1 − β₁, β₂, 1 − β₂ per member (computed in double as PEFT's Python floats are), shaped
        (members, 1, 1); 1, 0, 1, 0 for a member whose importance does not move at this step."""
        key = ("betas", tuple(members), device)
        if key not in self._cache:
            values = []
            for name in ("beta1", "beta2"):
                beta = [float(self.users[m][f"adalora_{name}"]) if m in members else 1.0 for m in self.slots]
                values += [beta, [1 - b if m in members else 0.0 for m, b in zip(self.slots, beta)]]
            self._cache[key] = [to_device(torch.tensor(v), device).view(-1, 1, 1) for v in values]
        return self._cache[key]

    def checkpoint(self) -> dict:
        """What training changes here (a checkpoint holds it): the kept triplets and the importance EMAs (None before
        the first update)."""
        return {"kept": self.kept, "importance": self._state}

    def restore(self, saved: dict) -> None:
        """Put back a `checkpoint()`, after `plan`."""
        self.kept = saved["kept"].to(self.kept.device)
        self._cache = {}
        if saved["importance"] is None:
            self._state = self.state = None
            return
        self._allocate(self.parameters()[0].device)
        for group, values in zip(self._state, saved["importance"], strict=True):
            for key in ("ipt", "unc"):
                group[key].copy_(values[key])

    def _allocate(self, device) -> None:
        """The importance state, zero: one tensor per group of tensors, and each parameter's view of it (`state`)."""
        self._state = [{key: torch.zeros(len(indices), self.width, *self.modules[indices[0]].triplets()[kind].shape[1:],
                                         device=device) for key in ("ipt", "unc")}
                       for kind, indices in self.groups]
        self.state = [{key: group[key][i] for key in ("ipt", "unc")}
                      for group, (_, indices) in zip(self._state, self.groups) for i in range(len(indices))]

    def _update_importance(self, members: list[int]) -> None:
        """Sensitivity |w · g| smoothed (β₁), and its uncertainty (β₂), for the members in `members` only: one
        foreach operator per term over every parameter (the others' rows get β = 1 and keep their values)."""
        parameters = self.parameters()
        if self._state is None:
            self._allocate(parameters[0].device)
        beta1, beta1c, beta2, beta2c = self._betas(members, parameters[0].device)
        size = len(parameters)
        grads = [self._span(p.grad if p.grad is not None else torch.zeros_like(p)) for p in parameters]
        ipt = torch._foreach_mul(self._spans(parameters), grads)
        torch._foreach_abs_(ipt)
        old = [state["ipt"] for state in self.state]
        smoothed = torch._foreach_mul(old, [beta1] * size)
        torch._foreach_add_(smoothed, torch._foreach_mul(ipt, [beta1c] * size))
        uncertain = torch._foreach_sub(ipt, smoothed)
        torch._foreach_abs_(uncertain)
        torch._foreach_mul_(uncertain, [beta2c] * size)
        unc = [state["unc"] for state in self.state]
        torch._foreach_add_(uncertain, torch._foreach_mul(unc, [beta2] * size))
        torch._foreach_copy_(old, smoothed)
        torch._foreach_copy_(unc, uncertain)

    def scores(self) -> torch.Tensor:
        """(matrices, members, R): each triplet's importance (PEFT's mask_to_budget); +inf where a member has no
        triplet (past its rank, or a matrix it does not adapt), so it is never counted or masked."""
        parts: dict[int, list] = {A: [], E: [], B: []}
        for (kind, indices), state in zip(self.groups, self._state):
            product = state["ipt"] * state["unc"]  # (matrices, members, ...)
            score = product.mean(dim=3) if kind == A else product.mean(dim=2) if kind == B else product.squeeze(3)
            if score.shape[-1] < self.rank:
                score = F.pad(score, (0, self.rank - score.shape[-1]), value=float("inf"))
            parts[kind].append((indices, score))
        a, e, b = (self._in_module_order(parts[kind]) for kind in (A, E, B))
        return (e + (a + b)).masked_fill(~self._rank_mask_on(e.device), float("inf"))

    def _in_module_order(self, parts: list) -> torch.Tensor:
        order = [i for indices, _ in parts for i in indices]
        scores = parts[0][1] if len(parts) == 1 else torch.cat([score for _, score in parts])
        if order == list(range(len(self.modules))):
            return scores
        key = ("order", tuple(order), scores.device)
        if key not in self._cache:
            self._cache[key] = self._members(torch.tensor(order).argsort().tolist(), scores.device, torch.long)
        return scores.index_select(0, self._cache[key])

    def _rank_mask_on(self, device) -> torch.Tensor:
        key = ("rank mask", device)
        if key not in self._cache:
            self._cache[key] = self._rank_mask().to(device)
        return self._cache[key]

    def _mask_to_budget(self, budgets: dict[int, int]) -> None:
        """For each member in `budgets`: the triplets whose importance is at most the (b₀ − b)-th smallest of its own
        get Λ = 0 (PEFT: kthvalue over the concatenated scores, masked where ≤ the threshold). Every member's scores
        are sorted at once; the others keep their pattern (k = −1)."""
        scores = self.scores()
        device = scores.device
        ks = to_device(torch.tensor([self.init_budget[m] - budgets[m] if m in budgets else -1
                                     for m in self.slots]), device)  # changes every step: not kept
        ordered = scores.transpose(0, 1).reshape(self.width, -1).sort(dim=1).values
        thresholds = ordered.gather(1, (ks - 1).clamp(min=0)[:, None]).squeeze(1)
        thresholds = torch.where(ks > 0, thresholds, -float("inf"))
        kept = (scores > thresholds[:, None]) & self._rank_mask_on(device)
        self.kept = torch.where((ks >= 0)[:, None], kept, self.kept)

    def _apply(self, members: list[int]) -> None:
        """Λ = 0 where the members' kept pattern says masked: one masked_fill per group of Λs of one shape."""
        device = self.kept.device
        rows = self._members([m in members for m in self.slots], device, torch.bool)
        masked = (rows[:, None] & ~self.kept)[..., None]  # (matrices, members of the span, R, 1)
        if self.width < self.count:  # every slot: the others' Λ are never masked
            masked = F.pad(masked, (0, 0, 0, 0, self.first, self.count - self.first - self.width))
        for kind, indices in self.groups:
            if kind != E:
                continue
            lambdas = [self.modules[i].lora_E for i in indices]
            rank = lambdas[0].shape[1]
            which = masked if len(indices) == len(self.modules) else masked.index_select(
                0, self._members(indices, device, torch.long))
            filled = torch.stack(lambdas).masked_fill(which[:, :, :rank], 0.0)
            torch._foreach_copy_(lambdas, filled.unbind(0))

    def _reset(self, members: list[int]) -> None:
        if self._state is None:
            return
        rows = self._members([m in members for m in self.slots], self._state[0]["ipt"].device, torch.bool)
        for state in self._state:
            shape = (1, self.width, *[1] * (state["ipt"].dim() - 2))
            for key in ("ipt", "unc"):
                state[key].masked_fill_(rows.view(shape), 0.0)

    def rank_pattern(self, slot: int) -> list[list[bool]]:
        """Member `slot`'s kept triplets, per adapted matrix it has (in the modules' order), on its own rank."""
        rank = int(self.users[slot].adalora_init_rank)
        return [kept[slot - self.first, :rank].tolist() for module, kept in zip(self.modules, self.kept)
                if slot in module.users]

    def regulariser(self, members: Members) -> torch.Tensor | None:
        """(active members,): γ · mean over the member's adapted matrices of ‖QQᵀ − I‖_F and ‖PᵀP − I‖_F (PEFT's
        AdaLoraModel.forward; 0 for members without AdaLoRA); None when no active member has AdaLoRA. Each member's
        term reaches only its own slots. For the active AdaLoRA members at once (a member's slots of a matrix it does
        not adapt are zeros, and so is its identity): one pair of batched products per shape of tensor, summed over
        the matrices in their order."""
        device = self.modules[0].lora_A.device
        selection = members.select(tuple(sorted(self.users)), device)
        if not selection.count:
            return None
        norms: dict[int, list] = {A: [], B: []}
        for kind, indices in self.groups:
            if kind == E:
                continue
            stacked = torch.stack([self.modules[i].triplets()[kind] for i in indices])  # (matrices, members, ...)
            flat = members.slots_of(stacked, selection, dim=1).flatten(0, 1)  # (matrices · members, ...)
            gram = torch.bmm(flat, flat.transpose(1, 2)) if kind == A else torch.bmm(flat.transpose(1, 2), flat)
            norm = torch.linalg.matrix_norm(gram - self._identity(indices, members, selection, gram))
            norms[kind].append((indices, norm.view(len(indices), selection.count, 1)))
        total = (self._in_module_order(norms[A]) + self._in_module_order(norms[B])).squeeze(2).sum(0)
        total = total * members.slots_of(self._weights(device), selection)
        if selection.every:
            return total
        return total.new_zeros(members.active_count).index_copy(0, selection.positions.to(device), total)

    def _identity(self, indices: list[int], members: Members, selection, gram: torch.Tensor) -> torch.Tensor:
        """(matrices · selected members, r, r): each member's own triplets of those matrices on the diagonal."""
        key = ("identity", tuple(indices), tuple(members.active_slots()), gram.device, gram.dtype)
        if key not in self._cache:
            slots = [slot for slot in members.active_slots() if slot in self.users]
            mask = self._rank_mask(every=True)[indices][:, slots, : gram.shape[-1]].flatten(0, 1)
            self._cache[key] = torch.diag_embed(mask.to(gram.dtype)).to(gram.device)
        return self._cache[key]

    def _weights(self, device) -> torch.Tensor:
        """γ / (2 · the member's adapted matrices), per member slot (0 without AdaLoRA)."""
        return self._members([float(self.users[m].adalora_orth_reg) / (2 * self.matrices[m]) if m in self.users
                              else 0.0 for m in range(self.count)], device)
