"""Parity: the executor's gradients, parameters, buffers and RNG equal plain autograd's bit for bit."""

from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch
import torchvision

from engine.errors import InputMismatchError
from engine.chunked_loss import ChunkedNextTokenLoss, defer_head
from engine.executor import Executor
from engine.lean_backward import lean_pow
from engine.parity import bits_equal
from engine.extract import extract
from agent.zoo import decoder_lm
from schedules.budgets import memory_lower_bound, smallest_feasible_budget
from schedules.floors import node_lower_bounds
from schedules.plan import plan
from tests.engine.models import (
    ATTENDING_CUT, PASS_THROUGH_CUT, Attending, FanIn, FrozenBackbone, PassThrough,
    MixedPrecision, TinyUNet, bert_classifier, bert_example, cross_entropy, fan_in_example, image_example,
    logits_cross_entropy, mlp, mlp_example, padded_bert_example, page_everything, recompute_everything, schedule_for, unet_example,
    gpt2_decoder, llama_decoder, next_token_cross_entropy, next_token_example, small_vit,
)


def _store_all(graph):
    return plan(graph, "rpi4", method="store-all").schedule


def _checkpoint_all(graph):
    return plan(graph, "rpi4", method="checkpoint-all").schedule


def _sqrt_n(graph):
    return plan(graph, "rpi4", method="sqrt-n").schedule


def _paging(graph):
    return schedule_for(graph, page_everything(graph))


def _recompute(graph):
    return schedule_for(graph, recompute_everything(graph))


# Every planner's and hand-made policy's schedule; the fast suite runs the two that stress the executor most.
FAST_SCHEDULES = ["recompute", "paging"]
SCHEDULES = {"store-all": _store_all, "checkpoint-all": _checkpoint_all, "sqrt-n": _sqrt_n,
             "recompute": _recompute, "paging": _paging}


def assert_exact(model_fn: Callable, example_fn: Callable, loss_fn: Callable, make_schedule: Callable,
                 swap_dir, steps: int = 3, optimizer: str = "sgd", refine: bool = False,
                 segments: list[str] | None = None, loss_of: Callable | None = None) -> Executor:
    """Train a model and its copy side by side, one through the executor; everything must be equal.

    ``loss_of(model)``, where given, makes the model's loss (a loss bound to the model's parameters; the copy
    gets its ``for_model``); ``loss_fn`` is then unused."""
    torch.manual_seed(0)
    model = model_fn().train()
    reference = copy.deepcopy(model)
    if loss_of is not None:
        loss_fn = loss_of(model)
        ref_loss_fn = loss_fn.for_model(reference)
    else:
        ref_loss_fn = loss_fn
    graph, segments = extract(model, example_fn(), loss_fn, repeats=1, refine=refine, segments=segments)
    _assert_same_model(model, reference)  # extraction leaves the model untouched
    opt, ref_opt = (_optimizer(optimizer, m) for m in (model, reference))
    with Executor(model, segments, graph, make_schedule(graph), swap_dir=swap_dir) as ex:
        for _ in range(steps):
            inputs, targets = example_fn()
            rng = torch.get_rng_state()
            ref_opt.zero_grad()
            ref_loss = ref_loss_fn(reference(*_args(inputs)), targets)
            ref_loss.backward()
            ref_rng = torch.get_rng_state()
            torch.set_rng_state(rng)
            opt.zero_grad()
            loss = ex.step(inputs, targets)
            assert bits_equal(loss, ref_loss.detach())
            assert torch.equal(torch.get_rng_state(), ref_rng)
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                assert (p.grad is None) == (q.grad is None), name
                assert p.grad is None or bits_equal(p.grad, q.grad), name
            opt.step()
            ref_opt.step()
            _assert_same_model(model, reference)
            stats = ex.last_stats
            assert stats.max_ledger_deviation == 0
            assert stats.budget is None or stats.ledger_peak_bytes <= stats.budget
            pages = sum(op == "page_out" for op, _ in ex.instructions)
            assert (stats.bytes_paged_out > 0) == (pages > 0)
            assert stats.bytes_paged_in == sum(ex.graph.nodes[n].bytes for op, n in ex.instructions if op == "page_in")
    return ex


def _args(inputs):
    return inputs if isinstance(inputs, tuple) else (inputs,)


def _optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _assert_same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert bits_equal(x, y), name


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_resnet18_exact(schedule, tmp_path):
    assert_exact(lambda: torchvision.models.resnet18(num_classes=10), image_example, cross_entropy,
                 SCHEDULES[schedule], tmp_path, steps=2)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_unet_exact_with_skip_connections_dropout_and_batchnorm(schedule, tmp_path):
    assert_exact(TinyUNet, unet_example, cross_entropy, SCHEDULES[schedule], tmp_path, optimizer="adam")


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_mlp_dropout_masks_replayed_exactly(schedule, tmp_path):
    assert_exact(mlp, mlp_example, cross_entropy, SCHEDULES[schedule], tmp_path, steps=4)


@pytest.mark.parametrize("schedule", ["store-all", "paging"])
def test_gradient_sums_exact_where_one_gradient_feeds_two_ports(schedule, tmp_path):
    assert_exact(FanIn, fan_in_example, cross_entropy, SCHEDULES[schedule], tmp_path)


@pytest.mark.parametrize("schedule", [*FAST_SCHEDULES, "sqrt-n"])
def test_gradients_passed_straight_through_exact_while_their_maker_is_paged_or_freed(schedule, tmp_path):
    assert_exact(PassThrough, fan_in_example, cross_entropy, SCHEDULES[schedule], tmp_path,
                 segments=PASS_THROUGH_CUT)


@pytest.mark.parametrize("schedule", [*FAST_SCHEDULES, "sqrt-n"])
def test_views_taken_beside_their_use_exact(schedule, tmp_path):
    assert_exact(Attending, fan_in_example, cross_entropy, SCHEDULES[schedule], tmp_path, segments=ATTENDING_CUT)


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_bert_exact_with_dropout(schedule, tmp_path):
    pytest.importorskip("transformers")
    assert_exact(bert_classifier, bert_example, logits_cross_entropy, SCHEDULES[schedule], tmp_path,
                 optimizer="adam")


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_gpt2_style_decoder_with_tied_embeddings_exact(schedule, tmp_path):
    pytest.importorskip("transformers")
    tied = gpt2_decoder()
    assert tied.lm_head.weight is tied.transformer.wte.weight  # one parameter, its gradient summed over both uses
    assert_exact(gpt2_decoder, next_token_example, next_token_cross_entropy, SCHEDULES[schedule], tmp_path,
                 optimizer="adam")


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_llama_style_decoder_with_grouped_query_attention_and_rotary_embeddings_exact(schedule, tmp_path):
    pytest.importorskip("transformers")
    assert_exact(llama_decoder, next_token_example, next_token_cross_entropy, SCHEDULES[schedule], tmp_path,
                 optimizer="adam")


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_code_run_under_no_grad_stays_without_gradients(schedule, tmp_path):
    """A frozen backbone called under torch.no_grad(), and a no_grad statistic between segments: replayed with
    gradients on, the executor gave the backbone gradients plain autograd does not."""
    ex = assert_exact(FrozenBackbone, mlp_example, cross_entropy, SCHEDULES[schedule], tmp_path)
    assert all(p.grad is None for p in ex.runtime.model.backbone.parameters())


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_code_run_under_autocast_runs_under_it_again(schedule, tmp_path):
    """Replayed without the model's own autocast, the step computed in float32 what plain PyTorch computes
    in bfloat16: every gradient differed."""
    assert_exact(MixedPrecision, mlp_example, cross_entropy, SCHEDULES[schedule], tmp_path)


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_bert_with_an_attention_mask_exact_on_padded_batches_and_stops_on_unpadded(schedule, tmp_path):
    """transformers skips the mask where no token is padded (an `if` on the mask's values): the executor
    replays the padded example's path, exact for padded batches, and refuses a batch without padding."""
    pytest.importorskip("transformers")
    done = assert_exact(bert_classifier, padded_bert_example, logits_cross_entropy, SCHEDULES[schedule], tmp_path)
    model = done.runtime.model
    with Executor(model, done.runtime.segments, done.graph, done.schedule, swap_dir=tmp_path) as ex:
        before = [t.clone() for t in model.state_dict().values()]
        with pytest.raises(InputMismatchError, match="another path through BertForSequenceClassification"):
            ex.step(*padded_bert_example(padded=False))
        assert all(bits_equal(a, b) for a, b in zip(before, model.state_dict().values()))


def _mobilenet():
    return torchvision.models.mobilenet_v2(num_classes=10)


def _vgg():
    return torchvision.models.vgg11_bn(num_classes=10)


def test_mobilenet_v2_exact(tmp_path):
    assert_exact(_mobilenet, image_example, cross_entropy, _paging, tmp_path, steps=2)


# -- slow: the remaining schedules, VGG, CIFAR-size and 64x64 inputs, the benchmark's BERT ----------------
@pytest.mark.slow
@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s not in FAST_SCHEDULES])
def test_bert_exact_with_dropout_slow(schedule, tmp_path):
    pytest.importorskip("transformers")
    assert_exact(bert_classifier, bert_example, logits_cross_entropy, SCHEDULES[schedule], tmp_path,
                 optimizer="adam")


@pytest.mark.slow
@pytest.mark.parametrize("size", [32, 64])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_mobilenet_v2_exact_slow(schedule, size, tmp_path):
    assert_exact(_mobilenet, lambda: image_example(4, size), cross_entropy, SCHEDULES[schedule], tmp_path, steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("size", [32, 64])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_vgg11_bn_exact(schedule, size, tmp_path):
    assert_exact(_vgg, lambda: image_example(2, size), cross_entropy, SCHEDULES[schedule], tmp_path, steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["store-all", "checkpoint-all", "sqrt-n"])
def test_resnet18_exact_slow(schedule, tmp_path):
    assert_exact(lambda: torchvision.models.resnet18(num_classes=10), image_example, cross_entropy,
                 SCHEDULES[schedule], tmp_path, steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_resnet18_64x64_exact(schedule, tmp_path):
    assert_exact(lambda: torchvision.models.resnet18(num_classes=10), lambda: image_example(8, 64), cross_entropy,
                 SCHEDULES[schedule], tmp_path, steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["sqrt-n", "paging"])
def test_bert_benchmark_size_exact(schedule, tmp_path):
    pytest.importorskip("transformers")
    assert_exact(lambda: bert_classifier(layers=4, hidden=256, vocab=1000, positions=128, labels=10),
                 lambda: bert_example(8, 128, vocab=1000, labels=10), logits_cross_entropy, SCHEDULES[schedule],
                 tmp_path, steps=2, optimizer="adam")


def _at_floor(graph):
    """POET's schedule at the smallest budget it finds: recomputation and paging together at the cut's floor."""
    search = smallest_feasible_budget(graph, lambda b, t: plan(graph, "rpi4", memory_budget=b, time_limit=t, gap=0.05),
                                      time_budget_s=60, probe_time_limit_s=20, rel_tolerance=0.02)
    assert search.budget is not None
    return plan(graph, "rpi4", memory_budget=search.budget, time_limit=20, gap=0.05).schedule


FAMILIES = {  # model, example, loss
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), image_example, cross_entropy),
    "vit": (small_vit, image_example, cross_entropy),
    "bert": (bert_classifier, bert_example, logits_cross_entropy),
    "gpt2-tied": (gpt2_decoder, next_token_example, next_token_cross_entropy),
    "llama": (llama_decoder, next_token_example, next_token_cross_entropy),
    "unet": (TinyUNet, unet_example, cross_entropy),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_exact_at_its_floor_under_the_refined_cut(family, tmp_path):
    model_fn, example_fn, loss_fn = FAMILIES[family]
    ex = assert_exact(model_fn, example_fn, loss_fn, _at_floor, tmp_path, optimizer="adam", refine=True)
    graph, segments = ex.graph, ex.runtime.segments
    assert graph.cut and graph.operator_bound_bytes > 0
    # the schedule frees a light unit before its backward runs, which then runs on the unit's kept graph
    order = [(op, n) for op, n in ex.instructions]
    freed_early = [n for n in segments.light
                   if ("free", n) in order and order.index(("free", n)) < order.index(("compute", segments.backward_of(n)))]
    assert freed_early


class TanhGelu(torch.nn.Module):
    """GELU's tanh approximation written as operations (as GPT-2's activation is): one module, eight kernels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 256), TanhGelu(), torch.nn.Linear(256, 5))


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_a_module_cut_into_its_operations_trains_exactly(schedule, tmp_path):
    ex = assert_exact(_gelu_mlp, mlp_example, cross_entropy, SCHEDULES[schedule], tmp_path, segments=["0", "1:ops", "2"])
    names = [n.name for n in ex.graph.nodes if n.kind == "forward"]
    assert names[:3] == ["input", "0", "1:mul"] and "1:pow" in names and "1:tanh" in names and names[-1] == "2"
    # its cube runs the lean backward (one scratch buffer), and the gradients above are still PyTorch's bits
    assert any(node.target is lean_pow for unit in ex.runtime.segments.units for node in unit.nodes)
    assert ex.graph.cut == ("0", "1:ops", "2")


def test_chunked_loss_decoder_exact_at_its_floor_and_its_floor_below_the_logits(tmp_path):
    """The chunked loss is not bit-identical to plain cross-entropy, but the executor is bit-identical to plain
    autograd on it; and with a vocabulary larger than the model, its floor falls below the logits'."""
    pytest.importorskip("transformers")
    vocab = 8192
    model_fn = lambda: decoder_lm("gpt2", layers=2, hidden=64, heads=4, vocab=vocab, positions=32)
    example = lambda: next_token_example(8, 16, vocab=vocab)
    ex = assert_exact(lambda: defer_head(model_fn()), example, None, _at_floor, tmp_path, optimizer="adam",
                      loss_of=lambda m: ChunkedNextTokenLoss.of(m, chunk_bytes=4 * vocab * 8))
    torch.manual_seed(0)
    plain = model_fn().train()
    plain_graph, _ = extract(plain, example(), next_token_cross_entropy, repeats=1, refine=False)
    logits = 8 * 16 * vocab * 4
    assert memory_lower_bound(plain_graph) >= 2 * logits  # the logits and their gradient at once
    assert memory_lower_bound(ex.graph) < memory_lower_bound(plain_graph) / 2
    needs = node_lower_bounds(ex.graph)
    assert all(needs[i] < logits for i, node in enumerate(ex.graph.nodes) if "loss" in node.name)


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_multi_head_attention_cut_into_its_operations_trains_exactly(schedule, tmp_path):
    """nn.MultiheadAttention's forward is one torch function call; cut into operations, its own operations
    (projections, attention, output projection) are units that a schedule frees, pages and recomputes."""
    layer = "encoder.layers.encoder_layer_0"
    cut = ["conv_proj", "encoder.dropout", f"{layer}.ln_1", f"{layer}.self_attention:ops", f"{layer}.dropout",
           f"{layer}.ln_2", f"{layer}.mlp", f"{layer}:ops", "encoder.layers.encoder_layer_1", "encoder.ln",
           "encoder:ops", "heads.head"]
    dropping = lambda: torchvision.models.VisionTransformer(  # attention dropout: its masks replayed too
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10,
        dropout=0.1, attention_dropout=0.1)
    ex = assert_exact(dropping, image_example, cross_entropy, SCHEDULES[schedule], tmp_path, segments=cut,
                      optimizer="adam")
    names = [n.name for n in ex.graph.nodes if n.kind == "forward"]
    attention = [n for n in names if "self_attention:" in n]
    assert len(attention) >= 3  # in-projection, attention, out-projection at least
    assert any("_safe_softmax" in n for n in attention)  # with dropout, attention is opened up too


@pytest.mark.parametrize("schedule", FAST_SCHEDULES)
def test_attention_with_dropout_cut_into_its_operations_trains_exactly(schedule, tmp_path):
    """scaled_dot_product_attention with dropout is one call; cut into operations, its math backend's product,
    softmax, dropout and product are units of their own, their dropout masks replayed."""
    pytest.importorskip("transformers")
    from agent.zoo import bert_sublayers

    attention = "bert.encoder.layer.0.attention.self"
    cut = [entry for name in bert_sublayers(bert_classifier()) for entry in (
        [f"{attention}.query", f"{attention}.key", f"{attention}.value", f"{attention}:ops"]
        if name == attention else [name])]
    ex = assert_exact(bert_classifier, bert_example, logits_cross_entropy, SCHEDULES[schedule], tmp_path,
                      segments=cut, optimizer="adam")
    names = [n.name for n in ex.graph.nodes if n.kind == "forward" and f"{attention}:" in n.name]
    assert any("_safe_softmax" in n for n in names) and any("dropout" in n for n in names)
    assert not any("scaled_dot_product_attention" in n for n in names)


TORCHVISION_FAMILIES = ["squeezenet1_0", "shufflenet_v2_x0_5", "efficientnet_b0", "convnext_tiny", "densenet121",
                        "regnet_x_400mf", "mnasnet0_5"]


@pytest.mark.parametrize("arch", TORCHVISION_FAMILIES)
def test_torchvision_families_exact_under_recomputation(arch, tmp_path):
    # fire modules and concatenations, channel shuffles, squeeze-excitation and stochastic depth, layer scale,
    # dense concatenations, grouped convolutions: each recomputed from scratch for its backward
    assert_exact(lambda: getattr(torchvision.models, arch)(num_classes=10), image_example, cross_entropy,
                 SCHEDULES["recompute"], tmp_path, steps=2)
