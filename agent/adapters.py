"""Adapters: LoRA through ``peft``, so a device trains (and shares) a few small matrices, not the whole model.

``[workload] adapters = "lora"`` wraps the workload's model with ``peft.get_peft_model`` after its pretrained
weights are loaded (:func:`with_adapters`): rank ``lora_rank``, scale ``lora_alpha``, dropout ``lora_dropout``,
on the modules ``lora_targets`` names (empty: peft's own choice for a transformers architecture it knows).  The
base weights are frozen, so extraction plans gradients and optimizer state for the adapters only, and the
executor's steps stay bit-identical to plain ``peft`` training of the same adapters (dropout masks replayed on
recomputation as any other).  :func:`adapter_keys` names the state-dict entries that are the adapters': the only
ones a federated device sends.  :func:`merged_for_inference` folds them into the base weights for export.
"""

from __future__ import annotations

import dataclasses
import torch.nn as nn

from agent.config import WorkloadSection
from agent.errors import ZooError
from engine.extract import default_segments
from engine.workload import Workload

PEFT_PREFIX = "base_model.model."  # where peft puts the wrapped model's modules


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """``[workload]``'s adapter keys."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ()  # module names or suffixes; empty: peft's defaults for the architecture

    @classmethod
    def from_config(cls, workload: WorkloadSection) -> LoraSettings:
        return cls(workload.lora_rank, workload.lora_alpha, workload.lora_dropout, workload.lora_targets)


def with_adapters(workload: Workload, settings: LoraSettings) -> Workload:
    """``workload`` with its model wrapped in LoRA adapters (the base frozen); segments renamed to match."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ZooError("workload.adapters = \"lora\" needs peft, which is not installed: "
                       "pip install 'poet-edge[device]'") from exc
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.targets) or None)
    try:
        model = get_peft_model(workload.model, config)
    except ValueError as exc:  # peft's words for targets it cannot find or an architecture it has no default for
        raise ZooError(f"LoRA on {workload.name}: {exc} (set workload.lora_targets to the names of its Linear "
                       "layers, e.g. [\"q_proj\", \"v_proj\"])") from exc
    model.train()
    # the cut is the wrapped model's own: peft's outer modules are not called one by one (a plain PeftModel
    # calls the wrapped model directly), so the default rule would find nothing to cut at
    inner = workload.segments or default_segments(model.get_base_model())
    segments = tuple(PEFT_PREFIX + s if s else PEFT_PREFIX.rstrip(".") for s in inner)
    return dataclasses.replace(workload, name=f"{workload.name}+lora", model=model, segments=segments)


def adapter_keys(model: nn.Module) -> frozenset[str]:
    """The state-dict names of the parameters that train (the adapters'): what a device shares and checkpoints
    differ in; everything else is the frozen base."""
    return frozenset(name for name, p in model.named_parameters() if p.requires_grad)


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` is wrapped in adapters (some of its parameters frozen by them)."""
    return hasattr(model, "peft_config")


def merged_for_inference(model: nn.Module) -> nn.Module:
    """The model with its adapters folded into the base weights (``merge_and_unload``): a plain model of the
    base architecture for TorchScript or ONNX.  ``model`` itself is changed; a model without adapters is
    returned as it is."""
    if not has_adapters(model):
        return model
    return model.merge_and_unload()
