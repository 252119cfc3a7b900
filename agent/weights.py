"""Pretrained weights a workload starts from (``[workload] weights``), checked against the model they load into.

Three forms, the ones users have:

* a ``.safetensors`` file (read with :mod:`safetensors`, no code runs);
* a ``.pt`` / ``.pth`` / ``.bin`` state dict (``torch.load(weights_only=True)``: tensors only);
* a folder written by transformers' ``save_pretrained``: ``config.json`` beside ``model.safetensors``, a
  sharded ``model.safetensors.index.json`` or ``pytorch_model.bin``.  With ``[workload] model`` empty the
  model itself is built from that folder (:func:`pretrained_workload`, ``local_files_only``: nothing is
  downloaded); with a zoo or factory model named, only the folder's weights are loaded into it.

Every name and shape is checked before anything is copied (:func:`load_into`): a file for another model is
refused with the names that differ, never half-loaded.  Weights tied to another parameter (GPT-2's output
layer is its token embedding) may be absent from the file, as ``save_pretrained`` leaves them out.

:func:`agent.weight_files.fingerprint` hashes the files, so the prepared workload, its checkpoints and the
personalized model all name the weights they started from, and a resume never mixes models (checking a path
and hashing it need no torch: :mod:`agent.weight_files`, which the config check imports).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from agent.errors import WeightsError
from agent.weight_files import CONFIG, files, problems

_SHOWN = 5  # names listed in an error before "and N more"


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor at ``path`` by name (a folder's shards merged), on the CPU."""
    path = Path(path)
    found = problems(path)
    if found:
        raise WeightsError(found[0])
    state: dict[str, torch.Tensor] = {}
    for file in files(path):
        if file.name == CONFIG:
            continue
        state.update(_read_file(file))
    return state


def load_into(model: nn.Module, state: dict[str, Any], source: str) -> None:
    """Copy ``state`` into ``model`` after checking every name and shape; nothing is copied when one differs.

    Raises :class:`WeightsError` naming the missing, unexpected and misshapen tensors.
    """
    own = model.state_dict()
    not_tensors = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    unexpected = sorted(set(state) - set(own))
    missing = sorted(set(own) - set(state) - _tied_names(model, set(state)))
    misshapen = sorted(f"{k} {tuple(state[k].shape)} (the model's {tuple(own[k].shape)})"
                       for k in set(state) & set(own)
                       if isinstance(state[k], torch.Tensor) and state[k].shape != own[k].shape)
    reasons = []
    for label, names in (("not tensors", not_tensors), ("shapes differ", misshapen),
                         ("not in the model", unexpected), ("missing", missing)):
        if names:
            more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
            reasons.append(f"{label}: {', '.join(names[:_SHOWN])}{more}")
    if reasons:
        raise WeightsError(f"the weights in {source} are not for this model ({'; '.join(reasons)}): give weights "
                           "saved from the same architecture and size, or change workload.model to the one "
                           "they were saved from")
    with torch.no_grad():
        model.load_state_dict(state, strict=False)


def load_weights(model: nn.Module, path: Path) -> None:
    """``read_state`` then ``load_into``: ``model`` starts from the weights at ``path``."""
    load_into(model, read_state(path), str(path))


def pretrained_workload(path: Path, shape: tuple[int, ...] | None) -> Any:
    """A workload built from a ``save_pretrained`` folder: the model its config names, its weights, and a
    batch of ``shape`` (batch x sequence for a language model) with the loss its head trains with.

    Causal language models (``...ForCausalLM``, ``...LMHeadModel``) take the next-token loss, sequence
    classifiers cross-entropy over their labels; any other model the loss its output's shape implies
    (:func:`agent.zoo.workload_for_module`).  The key/value cache is turned off: it serves generation.
    """
    from agent.zoo import Workload, logits_cross_entropy, next_token_cross_entropy, workload_for_module

    path = Path(path)
    if shape is None:
        raise WeightsError(f"workload.input is required with a pretrained folder ({path.name}): batch x sequence "
                           "for a language model, e.g. 8x128, or the batch shape the model takes")
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise WeightsError(f"cannot read {path / CONFIG}: {exc}") from exc
    architectures = getattr(config, "architectures", None) or []
    cls = getattr(transformers, architectures[0], None) if architectures else None
    if cls is None:
        raise WeightsError(f"{path / CONFIG} names no architecture this transformers has ({architectures or 'none'}): "
                           "save the model with save_pretrained from a transformers model class")
    if hasattr(config, "use_cache"):
        config.use_cache = False
    model = cls(config)  # built, then loaded through load_into: the same checks as any state dict
    load_weights(model, path)
    model.train()
    vocab = getattr(config, "vocab_size", None)
    name = f"pretrained:{path.name}"
    if cls.__name__.endswith(("ForCausalLM", "LMHeadModel")) and isinstance(vocab, int):
        tokens = torch.randint(0, vocab, (shape[0], shape[-1] + 1))  # B, L + 1: inputs and next tokens
        return Workload(name, model, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(),
                        next_token_cross_entropy)
    if cls.__name__.endswith("ForSequenceClassification") and isinstance(vocab, int):
        labels = int(getattr(config, "num_labels", 2))
        return Workload(name, model, torch.randint(0, vocab, tuple(shape)),
                        torch.randint(0, labels, (shape[0],)), logits_cross_entropy)
    return workload_for_module(name, model, torch.randn(tuple(shape)))


# -- reading -------------------------------------------------------------------------
def _read_file(file: Path) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                return load_file(str(file), device="cpu")
            except SafetensorError as exc:
                raise WeightsError(f"{file} is not a readable safetensors file ({exc}): write it again") from exc
        loaded = torch.load(file, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise WeightsError(f"cannot read weights {file}: {exc.strerror or exc}") from exc
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:  # damaged, foreign, or code
        raise WeightsError(f"{file} is not a state dict torch can read with weights_only=True ({_gist(exc)}); "
                           "save it with torch.save(model.state_dict(), path)") from exc
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]  # the common {"state_dict": ...} wrapper of training scripts
    if not isinstance(loaded, dict):
        raise WeightsError(f"{file} holds a {type(loaded).__name__}, not a state dict (a mapping of names to "
                           "tensors): save it with torch.save(model.state_dict(), path)")
    return loaded


def _gist(exc: BaseException) -> str:
    """The line of torch's (long) refusal that says what was in the file."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if "WeightsUnpickler error" in line]
    return (said or lines or [type(exc).__name__])[0].split(". Please")[0]  # not its advice to trust the file


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """``alias -> source`` for each tensor of ``model``'s state dict that is an earlier one's (tied weights:
    GPT-2's output layer is its token embedding), in state-dict order."""
    first: dict[tuple[int, tuple[int, ...]], str] = {}
    aliases = {}
    for name, tensor in model.state_dict().items():
        if not tensor.numel():
            continue
        where = (tensor.data_ptr(), tuple(tensor.shape))
        if where in first:
            aliases[name] = first[where]
        else:
            first[where] = name
    return aliases


def _tied_names(model: nn.Module, present: set[str]) -> set[str]:
    """Names of the model's tensors tied to a tensor named in ``present`` (which ``save_pretrained`` writes
    once), either way round."""
    tied = set()
    for alias, source in tied_aliases(model).items():
        if source in present and alias not in present:
            tied.add(alias)
        elif alias in present and source not in present:
            tied.add(source)
    return tied


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise WeightsError("a save_pretrained folder needs transformers, which is not installed: "
                           "pip install 'poet-edge[zoo]'") from exc
    return transformers
