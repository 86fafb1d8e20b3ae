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
has them). Everything is member-stacked: one tensor operation per matrix and step serves all members.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from .base import Members


class Budget:
    """The budget state of a model's AdaLoRA members (`modules`: every SVDLinear, `users`: member → method)."""

    def __init__(self, modules: list, users: dict[int, DictConfig], count: int) -> None:
        self.modules = modules
        self.users = dict(users)
        self.count = count
        matrices = [sum(m in module.users for module in modules) for m in range(count)]
        self.init_budget = {m: int(method.adalora_init_rank) * matrices[m] for m, method in users.items()}
        self.target_budget = {m: int(method.adalora_target_rank) * matrices[m] for m, method in users.items()}
        self.matrices = matrices
        self.kept = [module.rank_mask.clone() for module in modules]  # (members, rank): triplets not masked (plan)
        self.state: list[dict[str, torch.Tensor]] | None = None
        self.schedule: dict[int, tuple[int, int, int]] = {}  # member → (T, t_i, t_f)
        self._betas: dict[str, torch.Tensor] = {}

    def plan(self, total_steps: list[int]) -> None:
        """Each member's schedule from its planned number of steps (PEFT's total_step). Training starts with every
        triplet kept, on the device the model now trains on (the budget was made with the model, before it moved)."""
        self.kept = [module.rank_mask.clone() for module in self.modules]
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
        """PEFT's update_and_allocate(step) for every active member, after the optimiser step, before zero_grad."""
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

    def _rows(self, members: list[int], device) -> torch.Tensor:
        rows = torch.zeros(self.count, dtype=torch.bool, device=device)
        rows[members] = True
        return rows

    def _beta(self, name: str, device) -> torch.Tensor:
        """(members,) β or 1 − β per member, each computed in double as PEFT's Python floats are."""
        if name not in self._betas:
            key, complement = name.rstrip("c"), name.endswith("c")
            values = [float(self.users[m][f"adalora_{key}"]) if m in self.users else 0.0 for m in range(self.count)]
            self._betas[name] = torch.tensor([1 - v if complement else v for v in values], device=device)
        return self._betas[name]

    def _update_importance(self, members: list[int]) -> None:
        """Sensitivity |w · g| smoothed (β₁), and its uncertainty (β₂), for the members in `members` only."""
        parameters = [p for module in self.modules for p in module.triplets()]
        if self.state is None:
            self.state = [{"ipt": torch.zeros_like(p), "unc": torch.zeros_like(p)} for p in parameters]
        device = parameters[0].device
        rows = self._rows(members, device)
        beta1, beta1c = self._beta("beta1", device), self._beta("beta1c", device)
        beta2, beta2c = self._beta("beta2", device), self._beta("beta2c", device)
        for p, state in zip(parameters, self.state):
            shape = (self.count, *[1] * (p.dim() - 1))
            ipt = (p * p.grad).abs() if p.grad is not None else torch.zeros_like(p)
            smoothed = beta1.view(shape) * state["ipt"] + beta1c.view(shape) * ipt
            uncertain = beta2.view(shape) * state["unc"] + beta2c.view(shape) * (ipt - smoothed).abs()
            chosen = rows.view(shape)
            state["ipt"] = torch.where(chosen, smoothed, state["ipt"])
            state["unc"] = torch.where(chosen, uncertain, state["unc"])

    def scores(self) -> list[torch.Tensor]:
        """Per matrix, (members, rank): each triplet's importance (PEFT's mask_to_budget); +inf where a member has
        no triplet (past its rank, or a matrix it does not adapt), so it is never counted or masked."""
        result = []
        for index, module in enumerate(self.modules):
            a, e, b = (state["ipt"] * state["unc"] for state in self.state[3 * index : 3 * index + 3])
            total = e.squeeze(-1) + (a.mean(dim=2) + b.mean(dim=1))
            result.append(total.masked_fill(~module.rank_mask, float("inf")))
        return result

    def _mask_to_budget(self, budgets: dict[int, int]) -> None:
        """For each member in `budgets`: the triplets whose importance is at most the (b₀ − b)-th smallest of its own
        get Λ = 0 (PEFT: kthvalue over the concatenated scores, masked where ≤ the threshold)."""
        scores = self.scores()
        everything = torch.cat(scores, dim=1)
        device = everything.device
        members = sorted(budgets)
        ks = torch.tensor([self.init_budget[m] - budgets[m] for m in members], device=device)
        ordered = everything[members].sort(dim=1).values
        thresholds = torch.full((self.count,), -float("inf"), device=device)
        thresholds[members] = ordered.gather(1, (ks - 1).clamp(min=0)[:, None]).squeeze(1)
        thresholds[members] = torch.where(ks > 0, thresholds[members], -float("inf"))
        rows = self._rows(members, device)
        for index, (module, score) in enumerate(zip(self.modules, scores)):
            kept = (score > thresholds[:, None]) & module.rank_mask
            self.kept[index] = torch.where(rows[:, None], kept, self.kept[index])

    def _apply(self, members: list[int]) -> None:
        """Λ = 0 where the members' kept pattern says masked."""
        rows = self._rows(members, self.kept[0].device)
        for module, kept in zip(self.modules, self.kept):
            module.lora_E.masked_fill_((rows[:, None] & ~kept)[..., None], 0.0)

    def _reset(self, members: list[int]) -> None:
        if self.state is None:
            return
        rows = self._rows(members, self.state[0]["ipt"].device)
        for state in self.state:
            shape = (self.count, *[1] * (state["ipt"].dim() - 1))
            for key in ("ipt", "unc"):
                state[key] = state[key].masked_fill(rows.view(shape), 0.0)

    def rank_pattern(self, slot: int) -> list[list[bool]]:
        """Member `slot`'s kept triplets, per adapted matrix it has (in the modules' order), on its own rank."""
        rank = int(self.users[slot].adalora_init_rank)
        return [kept[slot, :rank].tolist() for module, kept in zip(self.modules, self.kept) if slot in module.users]

    def regulariser(self, members: Members) -> torch.Tensor:
        """(active members,): γ · mean over the member's adapted matrices of ‖QQᵀ − I‖_F and ‖PᵀP − I‖_F (PEFT's
        AdaLoraModel.forward; 0 for members without AdaLoRA). Each member's term reaches only its own slots."""
        device = self.modules[0].lora_A.device
        total = torch.zeros(members.active_count, device=device)
        for module in self.modules:
            selection = members.select(module.users, device)
            if not selection.count:
                continue
            a = members.slots_of(module.lora_A, selection)
            b = members.slots_of(module.lora_B, selection)
            identity = torch.diag_embed(members.slots_of(module.rank_mask, selection).to(a.dtype))
            norms = (torch.linalg.matrix_norm(a @ a.transpose(1, 2) - identity)
                     + torch.linalg.matrix_norm(b.transpose(1, 2) @ b - identity))
            total = total.index_add(0, selection.positions, norms)
        weights = [float(self.users[m].adalora_orth_reg) / (2 * self.matrices[m]) if m in self.users else 0.0
                   for m in members.active_slots()]
        return total * torch.tensor(weights, device=device)
