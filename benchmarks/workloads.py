"""The benchmarks' models: zoo models, and the decoders at a 32,768-token vocabulary with and without the
chunked loss, built by name alike in a benchmark's parent and its child processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchModel:
    """A zoo model at a benchmark's input; a decoder's vocabulary where it is not the zoo's."""

    zoo: str
    input: str
    vocab: int | None = None
    chunked_loss: bool = False
    lora: bool = False  # LoRA adapters (peft's default targets, rank 8, alpha 16), the rest frozen

    def build(self, shape: tuple[int, ...] | None = None, seed: int = 0) -> Any:
        """The :class:`engine.workload.Workload`, at ``shape`` (default the benchmark's input), seeded."""
        import torch

        from engine.chunked_loss import chunk_loss
        from agent.zoo import decoder_workload, load_workload, parse_shape

        shape = shape or parse_shape(self.input)
        if self.vocab is None:
            work = load_workload(self.zoo, shape, seed=seed, chunked_loss=self.chunked_loss)
        else:
            torch.manual_seed(seed)
            work = decoder_workload(self.zoo, shape, self.vocab)
            work = chunk_loss(work) if self.chunked_loss else work
        if self.lora:
            from agent.adapters import LoraSettings, with_adapters

            torch.manual_seed(seed + 1)
            work = with_adapters(work, LoraSettings())
        return work

    @property
    def plain(self) -> "BenchModel":
        """The same model with the plain (unchunked) loss: what a chunked row is compared with."""
        return BenchModel(self.zoo, self.input, self.vocab)


LARGE_VOCAB = 32768

BENCH_MODELS: dict[str, BenchModel] = {
    "resnet18": BenchModel("resnet18", "32x3x64x64"),
    "mobilenet_v2": BenchModel("mobilenet_v2", "32x3x64x64"),
    "vgg11_bn": BenchModel("vgg11_bn", "16x3x64x64"),
    "unet": BenchModel("unet", "8x3x64x64"),
    "bert": BenchModel("bert", "8x128"),
    "gpt2": BenchModel("gpt2", "8x128"),
    "gpt2-32k": BenchModel("gpt2", "8x128", LARGE_VOCAB),
    "gpt2-32k-chunked": BenchModel("gpt2", "8x128", LARGE_VOCAB, chunked_loss=True),
    "llama": BenchModel("llama", "8x128"),
    "gpt2-lora": BenchModel("gpt2", "8x128", lora=True),
    "llama-lora": BenchModel("llama", "8x128", lora=True),
    "vit": BenchModel("vit", "16x3x64x64"),
    "swin_t": BenchModel("swin_t", "8x3x64x64"),
}
