"""The zoo's model names and the input each takes, without torch: the agent's configuration check knows
them at start, before any model is built (:mod:`agent.zoo` builds them)."""

from __future__ import annotations

import re

# name -> (input rank, an example input): what ``workload.input`` must look like for each zoo model
ZOO_INPUTS: dict[str, tuple[int, str]] = {
    "resnet18": (4, "32x3x64x64"),
    "mobilenet_v2": (4, "32x3x64x64"),
    "vgg11_bn": (4, "8x3x64x64"),
    "bert": (2, "8x128"),
    "unet": (4, "8x3x64x64"),
    "gpt2": (2, "8x128"),
    "llama": (2, "8x128"),
    "vit": (4, "16x3x64x64"),
    "swin_t": (4, "8x3x64x64"),
}
LANGUAGE_MODELS = frozenset({"gpt2", "llama"})
"""Zoo models with a next-token loss: the ones ``workload.chunked_loss`` applies to."""
FACTORY_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def model_problems(model: str, input: str | None) -> list[str]:
    """What is wrong with ``workload.model`` and ``workload.input`` as written (empty when nothing)."""
    if ":" in model:
        if not FACTORY_SPEC.fullmatch(model.strip()):
            return [f"workload.model = {model!r}: a model of your own is package.module:factory"]
        return []
    entry = ZOO_INPUTS.get(model.strip().lower())
    if entry is None:
        return [f"workload.model = {model!r} is not a zoo model ({', '.join(ZOO_INPUTS)}); a model of your own "
                "is package.module:factory"]
    rank, example = entry
    if input and len(input.lower().split("x")) != rank:
        return [f"workload.input = {input!r}: {model} takes a {rank}-dimensional input, batch first, e.g. {example}"]
    return []


def chunked_loss_problems(model: str, chunked_loss: bool) -> list[str]:
    """``workload.chunked_loss`` asked of a zoo model that is not a language model (a factory's model is
    checked when it is built)."""
    name = model.strip().lower()
    if chunked_loss and ":" not in model and name in ZOO_INPUTS and name not in LANGUAGE_MODELS:
        return [f"workload.chunked_loss = true: {model} is not a language model; the chunked loss takes "
                f"{', '.join(sorted(LANGUAGE_MODELS))} or a transformers causal LM of your own"]
    return []
