"""Small models and schedules shared by the executor and extraction tests."""

from __future__ import annotations

import torch
import torchvision
import torch.nn as nn

from agent.zoo import (SmallUNet, cross_entropy, decoder_lm, logits_cross_entropy,  # noqa: F401 - re-exported
                       next_token_cross_entropy)
from schedules.graph import TrainingGraph
from schedules.matrices import Instruction


def TinyUNet(c: int = 8, classes: int = 4) -> nn.Module:  # noqa: N802 - used like the class it builds
    """The zoo's U-Net, small and with dropout: skip connections cross segments, masks must be replayed."""
    return SmallUNet(channels=c, classes=classes, dropout=0.2)


def mlp() -> nn.Module:
    """Dropout between segments: recomputation must replay the masks."""
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 64), nn.GELU(),
                         nn.Dropout(0.3), nn.Linear(64, 5))


class FanIn(nn.Module):
    """``head`` takes ``(x1 + x2) * y``: the add hands one gradient tensor to two ports of ``head``'s backward.

    The gradients of ``x1`` and ``x2`` are sums over two consumers each, and the one both sums start from
    is that shared tensor: summing into it in place would corrupt the other port's gradient.
    """

    def __init__(self, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = (nn.Linear(width, width) for _ in range(3))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.l1(x)
        x2 = self.l2(x1)
        y = self.l3(x2)
        return self.head((x1 + x2) * y)


class Join(nn.Module):
    """``x + y`` as a module of its own: cut into operations (``join:ops``) the add is a unit whose backward
    passes the gradient of its output straight through, to both inputs."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class PassThrough(nn.Module):
    """``head(a(x) + b(a(x)))`` with the add a unit of its own (segments :data:`PASS_THROUGH_CUT`)."""

    def __init__(self, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)
        self.join = Join()
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.a(x)
        return self.head(self.join(x1, self.b(x1)))


PASS_THROUGH_CUT = ["a", "b", "join:ops", "head"]


class Heads(nn.Module):
    """Attention written out: the key's transpose is taken after the value projection, where it is used."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (f(x).view(x.shape[0], 2, -1).transpose(0, 1) for f in (self.q, self.k, self.v))
        weights = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return (weights @ v).transpose(0, 1).reshape(x.shape)


class Attending(nn.Module):
    """:class:`Heads` and a classifier; cut with :data:`ATTENDING_CUT` the attention's own code runs as
    operations."""

    def __init__(self, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.attn, self.head = Heads(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x))


ATTENDING_CUT = ["attn.q", "attn.k", "attn.v", "attn:ops", "head"]


def fan_in_example(batch: int = 4, width: int = 8, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, width), torch.randint(0, classes, (batch,))


def unet_example(batch: int = 2, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 3, size, size), torch.randint(0, 4, (batch, size, size))


def mlp_example(batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 32), torch.randint(0, 5, (batch,))


def image_example(batch: int = 2, size: int = 32, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))


def bert_classifier(layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 500, positions: int = 64,
                    labels: int = 3) -> nn.Module:
    """A BERT encoder classifier from transformers, built from a config (no download)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * hidden, num_labels=labels, max_position_embeddings=positions)
    return BertForSequenceClassification(config)


def gpt2_decoder(use_cache: bool = False) -> nn.Module:
    """The zoo's GPT-2-style causal LM (tied embeddings) at a test's size; ``use_cache`` as transformers has it."""
    model = decoder_lm("gpt2", layers=2, hidden=64, heads=4, vocab=128, positions=32)
    model.config.use_cache = use_cache
    return model


def llama_decoder() -> nn.Module:
    """The zoo's LLaMA-style causal LM (grouped-query attention, rotary embeddings, RMSNorm) at a test's size."""
    return decoder_lm("llama", layers=2, hidden=64, heads=4, vocab=128, positions=64)


def next_token_example(batch: int = 2, length: int = 16, vocab: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token ids, the ids one place on)``: next-token prediction on random text."""
    tokens = torch.randint(0, vocab, (batch, length + 1))
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def bert_example(batch: int = 2, length: int = 16, vocab: int = 500, labels: int = 3):
    return torch.randint(0, vocab, (batch, length)), torch.randint(0, labels, (batch,))


def padded_bert_example(batch: int = 2, length: int = 16, vocab: int = 500, labels: int = 3, padded: bool = True):
    """``((input_ids, attention_mask), labels)``: the last sequence padded from a random point when ``padded``."""
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:
        mask[-1, int(torch.randint(1, length, ())):] = 0
    return (torch.randint(0, vocab, (batch, length)), mask), torch.randint(0, labels, (batch,))




def page_everything(graph: TrainingGraph) -> list[Instruction]:
    """A schedule that keeps resident only what the next node needs and pages everything else.

    Every value still needed later is paged out as soon as the next node does not
    need it, and paged back in just before a consumer: the most paging a graph allows.
    """
    preds = graph.predecessors
    last_use = [max([i, *graph.successors[i]]) for i in range(graph.size)]
    resident: set[int] = set()
    on_flash: set[int] = set()
    out: list[Instruction] = []
    for i in range(graph.size):
        for p in preds[i]:
            if p not in resident:
                out.append(("page_in", p))
                resident.add(p)
        out.append(("compute", i))
        resident.add(i)
        keep = set(preds[i + 1]) if i + 1 < graph.size else set()
        for v in sorted(resident):
            if v in keep:
                continue
            if last_use[v] > i and v not in on_flash:
                out.append(("page_out", v))
                on_flash.add(v)
            out.append(("free", v))
            resident.discard(v)
    return out


def schedule_for(graph: TrainingGraph, instructions: list[Instruction], budget: int | None = None):
    """Wrap hand-made instructions as a Schedule (predictions from the simulator)."""
    from schedules.schedule import Schedule, SolverInfo
    from schedules.simulate import simulate

    report = simulate(graph, instructions, memory_budget=budget)
    return Schedule(
        instructions=tuple(instructions), graph_fingerprint=graph.fingerprint, graph_size=graph.size,
        model=graph.model, device="test", memory_budget=budget, runtime_budget_ms=None,
        predicted_peak_bytes=report.peak_bytes, predicted_runtime_ms=report.runtime_ms,
        predicted_energy_j=report.energy_j, solver=SolverInfo("hand", "none", "feasible", None, None, 0.0),
    )


def recompute_everything(graph: TrainingGraph) -> list[Instruction]:
    """A schedule that keeps only what the next node needs and recomputes the rest from the inputs.

    Backward values are kept until their last use (they cannot be recomputed);
    every forward value a node needs again is recomputed, recursively.
    """
    preds = graph.predecessors
    last_use = [max([i, *graph.successors[i]]) for i in range(graph.size)]
    resident: set[int] = set()
    out: list[Instruction] = []

    def ensure(v: int) -> None:
        if v in resident:
            return
        for p in preds[v]:
            ensure(p)
        out.append(("compute", v))
        resident.add(v)

    for i in range(graph.size):
        for p in preds[i]:
            ensure(p)
        out.append(("compute", i))
        resident.add(i)
        keep = set(preds[i + 1]) if i + 1 < graph.size else set()
        for v in sorted(resident):
            if v not in keep and (not graph.is_backward(v) or last_use[v] <= i):
                out.append(("free", v))
                resident.discard(v)
    return out


class FrozenBackbone(nn.Module):
    """Fine-tuning as on a device: a backbone called under ``torch.no_grad()`` (no gradients, no saved tensors),
    a statistic of its features computed under ``no_grad`` in the model's own forward, and a trained head."""

    def __init__(self, width: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        self.adapter = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Dropout(0.2))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(x)
        h = self.adapter(features)
        with torch.no_grad():
            scale = h.abs().mean(dim=1, keepdim=True) + 1  # a normaliser gradients do not flow through
        return self.head(h / scale)


class MixedPrecision(nn.Module):
    """Its own forward runs the middle under ``torch.autocast`` (bfloat16 on the CPU): the segments inside, and
    the glue, compute in bfloat16."""

    def __init__(self, width: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.mid(torch.relu(self.inp(x))) * 2
        return self.out(h.float())


class TiedLM(nn.Module):
    """A small next-token model whose output projection is its input embedding (tied weights): the embedding's
    gradient comes from two segments' backward nodes, and is final only after the second."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Sequential(nn.Linear(width, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, width))
        self.head = TiedHead(self.embed)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


class TiedHead(nn.Module):
    """Logits from the embedding's own weight."""

    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h @ self.embed.weight.t()).flatten(0, 1)


def tied_example(batch: int = 4, length: int = 6, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, vocab, (batch, length)), torch.randint(0, vocab, (batch * length,))


class WideHead(nn.Module):
    """A classifier whose first layer's weight (8 MiB) is large enough to have its gradient streamed in column
    blocks (:mod:`engine.optim.streamed`), with BatchNorm before it."""

    def __init__(self, features: int = 1024, hidden: int = 2048, classes: int = 5) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(features)
        self.wide = nn.Linear(features, hidden)
        self.act = nn.ReLU()
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.wide(self.norm(x))))


def wide_example(batch: int = 8, features: int = 1024, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, features), torch.randint(0, classes, (batch,))


class Leaky(nn.Module):
    """A layer that keeps a copy of every input it sees: memory no part of the plan accounts for, as a model
    with a cache or a debugging hook left in would keep."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.kept: list[torch.Tensor] = []
        self.leak_bytes = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.leak_bytes:
            self.kept.append(torch.ones(self.leak_bytes // 4))  # touched, so resident
        return self.linear(x)


def leaky_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), Leaky(32), nn.ReLU(), nn.Linear(32, 5))


def whole_step_schedule(graph: TrainingGraph, instructions: list[Instruction], spec, *, on_flash: bool = True,
                        budget: int | None = None):
    """Hand-made instructions as a schedule for the step's whole memory under ``spec`` (a
    :class:`schedules.step_memory.TrainingSpec` with its chunk set), every parameter's optimizer state on flash
    (or in RAM); the budget is the simulated peak unless given."""
    from schedules.plan import step_plan
    from schedules.schedule import Schedule, SolverInfo
    from schedules.simulate import simulate
    from schedules.step_memory import StepMemory

    memory = StepMemory.build(graph, spec)
    layout = memory.all_on_flash() if on_flash else memory.layout(())
    report = simulate(graph, instructions, step=layout)
    return Schedule(
        instructions=tuple(instructions), graph_fingerprint=graph.fingerprint, graph_size=graph.size,
        model=graph.model, device="test", memory_budget=budget or report.peak_memory_bytes, runtime_budget_ms=None,
        predicted_peak_bytes=report.peak_memory_bytes, predicted_runtime_ms=report.runtime_ms,
        predicted_energy_j=report.energy_j, solver=SolverInfo("hand", "none", "feasible", None, None, 0.0),
        step=step_plan(layout, report),
    )


def small_vit() -> nn.Module:
    """torchvision's VisionTransformer at a test size (32x32 images, patches of 8, 2 layers, hidden 32)."""
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=32, mlp_dim=64, num_classes=10)
