"""One optimizer update of one chunk of one parameter, by PyTorch's own per-tensor code.

:func:`rule_for` reads the torch optimizer (``SGD``, ``Adam``, ``AdamW``)
and returns the :class:`UpdateRule` that updates a chunk of a parameter
exactly as ``optimizer.step()`` with ``foreach=False`` updates the whole
tensor: it calls PyTorch's functional ``sgd`` / ``adam`` with the parameter
group's settings on views of the chunk.  The update is elementwise, so a
chunk at a time changes no bit (tests hold that against ``optimizer.step()``).

State follows PyTorch's names and creation rules: SGD's ``momentum_buffer``
is the first gradient's clone, Adam's ``exp_avg`` / ``exp_avg_sq`` (and
``max_exp_avg_sq``) start at zero and its ``step`` is a float32 scalar
counted once per parameter update, however many chunks the update takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from engine.errors import OptimizerError


@dataclass(frozen=True)
class UpdateRule:
    """How a parameter of one param group is updated; see the module docstring.

    ``state_names`` are its parameter-sized state tensors, in the order
    :meth:`update` takes and returns them.
    """

    kind: str  # "sgd" or "adam" (AdamW is Adam with decoupled weight decay)
    group: dict[str, Any]
    state_names: tuple[str, ...]

    def begin(self, state: dict[str, Any], param: torch.Tensor) -> None:
        """Before the chunks of ``param``'s update: Adam's step count starts at zero and counts this update."""
        if self.kind == "adam":
            if "step" not in state:
                state["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
            state["step"] += 1

    def update(self, state: dict[str, Any], param: torch.Tensor, grad: torch.Tensor,
               tensors: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Update the chunk ``param`` with ``grad``; ``tensors`` are its state chunks (``None`` where not made
        yet: created as PyTorch creates them).  Returns the state chunks, new ones included."""
        g = self.group
        with torch.no_grad():
            if self.kind == "sgd":
                buffers = list(tensors)
                sgd([param], [grad], buffers, has_sparse_grad=False, foreach=False, fused=False,
                    weight_decay=g["weight_decay"], momentum=g["momentum"], lr=g["lr"], dampening=g["dampening"],
                    nesterov=g["nesterov"], maximize=g["maximize"])
                return buffers  # type: ignore[return-value]
            made = [torch.zeros_like(param, memory_format=torch.preserve_format) if t is None else t for t in tensors]
            # the step was counted in begin(); adam() counts it again on a copy, as every chunk must see k + 1
            step = state["step"] - 1
            beta1, beta2 = g["betas"]
            adam([param], [grad], made[0:1], made[1:2], made[2:3], [step], foreach=False, capturable=False,
                 differentiable=False, fused=False, has_complex=torch.is_complex(param),
                 decoupled_weight_decay=g.get("decoupled_weight_decay", False), amsgrad=g["amsgrad"], beta1=beta1,
                 beta2=beta2, lr=g["lr"], weight_decay=g["weight_decay"], eps=g["eps"], maximize=g["maximize"])
            return made


def rule_for(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> UpdateRule:
    """The :class:`UpdateRule` of ``group`` in ``optimizer`` (SGD, Adam or AdamW, per tensor)."""
    if group.get("foreach") or group.get("fused"):
        raise OptimizerError(f"{type(optimizer).__name__} runs with foreach/fused kernels; updates fused into the "
                             "backward pass run per tensor: build it with foreach=False (the same results as "
                             "the per-tensor loop)")
    if group.get("differentiable") or group.get("capturable"):
        raise OptimizerError(f"{type(optimizer).__name__} with differentiable=True or capturable=True cannot run "
                             "its updates in the backward pass")
    if isinstance(optimizer, torch.optim.SGD):
        return UpdateRule("sgd", group, ("momentum_buffer",) if group["momentum"] != 0 else ())
    if isinstance(optimizer, torch.optim.Adam):  # AdamW included
        names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")
        return UpdateRule("adam", group, names)
    raise OptimizerError(f"{type(optimizer).__name__} cannot be fused into the backward pass: use SGD, Adam or AdamW")


def warm_up(optimizer: torch.optim.Optimizer) -> None:
    """Run the update rule of ``optimizer``'s first group twice on its first parameter (a scratch one).

    A first update and a later one run different kernels (SGD's momentum is the first gradient's clone, then a
    multiply-add), and a process faults in each kernel's code on its first use: code pages that a step running
    them first would count as its own memory, in a fresh process only."""
    param = optimizer.param_groups[0]["params"][0].detach()
    rule = rule_for(optimizer, optimizer.param_groups[0])
    state: dict[str, Any] = {}
    tensors: list[torch.Tensor | None] = [None] * len(rule.state_names)
    grad = torch.full_like(param, 1e-3)
    for _ in range(2):
        rule.begin(state, param)
        tensors = list(rule.update(state, param, grad, tensors))


def optimizer_name(optimizer: torch.optim.Optimizer) -> str:
    """``sgd``, ``adam`` or ``adamw``: the name a :class:`~schedules.step_memory.TrainingSpec` gives it."""
    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adamw" if optimizer.param_groups[0].get("decoupled_weight_decay") else "adam"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    raise OptimizerError(f"{type(optimizer).__name__} is not supported: use SGD, Adam or AdamW")


def _scalar_dtype() -> torch.dtype:
    """The dtype PyTorch's Adam keeps ``step`` in on the CPU."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
