"""Graph extraction: segments, POET's node layout and edges, measured bytes, errors that say what to do."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torchvision

from engine.extract import ExtractionError, default_segments, extract
from schedules.graph import TrainingGraph
from tests.engine.models import (ATTENDING_CUT, PASS_THROUGH_CUT, Attending, PassThrough, TinyUNet, cross_entropy,
                                fan_in_example, image_example, mlp, mlp_example, unet_example)


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).train()
    example = image_example()
    graph, segments = extract(model, example, cross_entropy, repeats=1, refine=False)
    return model, example, graph, segments


def test_default_segments_descend_containers_and_layer_stacks():
    names = default_segments(torchvision.models.resnet18())
    assert names[:4] == ["conv1", "bn1", "relu", "maxpool"]
    assert "layer1.0" in names and "layer4.1" in names and names[-2:] == ["avgpool", "fc"]
    assert "layer1" not in names and "layer1.0.conv1" not in names

    class Stack(nn.Module):  # like a transformer: a wrapper holding a ModuleList of layers
        def __init__(self):
            super().__init__()
            self.body = nn.Module()
            self.body.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
            self.head = nn.Linear(4, 2)

    assert default_segments(Stack()) == ["body.layers.0", "body.layers.1", "body.layers.2", "head"]


def test_resnet18_layout_follows_poet(resnet):
    model, example, graph, segments = resnet
    S = len(segments.units)
    assert graph.size == 2 * S + 3
    kinds = [n.kind for n in graph.nodes]
    assert kinds == ["forward"] * (S + 1) + ["loss"] + ["backward"] * (S + 1)
    names = [n.name for n in graph.nodes]
    # the in-place ReLU after bn1 would overwrite bn1's output: it runs out-of-place, a unit of its own
    assert names[:5] == ["input", "conv1", "bn1", "relu", "maxpool"]
    assert segments.out_of_place == ("relu",) and model.relu.inplace is False
    assert model.layer1[0].relu.inplace  # inside a unit, in place is harmless and kept
    assert names[S + 1] == "loss" and names[S + 2] == "grad:loss" and names[-1] == "grad:conv1"
    for f in range(1, S + 2):  # backward nodes mirror the forward ones
        assert graph.nodes[segments.backward_of(f)].name == "grad:" + graph.nodes[f].name


def test_backward_edges_are_exactly_what_autograd_needs(resnet):
    _, _, graph, segments = resnet
    preds = graph.predecessors
    conv1, bn, fc, loss = 1, 2, segments.loss_node - 1, segments.loss_node
    # conv1 saves the image (node 0), its own output is not saved: its backward needs the image and the
    # gradient bn1's backward left, not conv1's value (a light unit)
    assert preds[segments.backward_of(conv1)] == (0, segments.backward_of(bn))
    assert {conv1, fc} <= segments.light and loss not in segments.light
    # the loss saves the targets (node 0) and its log-softmax
    assert preds[segments.backward_of(loss)] == (0, loss)
    # fc (flatten + linear) saves its input, avgpool's output
    assert preds[segments.backward_of(fc)] == (fc - 1, segments.backward_of(loss))
    assert preds[loss] == (0, fc)


def test_bytes_are_outputs_plus_unique_saved_tensors(resnet):
    _, (x, y), graph, segments = resnet
    assert graph.nodes[0].bytes == x.nbytes + y.nbytes
    fc = segments.loss_node - 1
    assert graph.nodes[fc].bytes == 2 * 10 * 4                  # logits only: its input belongs to avgpool
    assert graph.nodes[segments.backward_of(fc)].bytes == 2 * 512 * 4  # gradient of the pooled features
    assert graph.nodes[segments.backward_of(1)].bytes == 0       # no gradient for the image
    reference = torchvision.models.resnet18(num_classes=10)
    params = sum(p.nbytes for p in reference.parameters())
    assert graph.fixed_bytes == params + sum(b.nbytes for b in reference.buffers())  # the loaded model
    assert graph.parameter_bytes == params and len(graph.parameters) == len(list(reference.parameters()))
    # each trained parameter's gradient is made by the backward node of the unit that uses it
    assert all(len(p.nodes) == 1 and graph.is_backward(p.nodes[0]) for p in graph.parameters)
    (fc_weight,) = [p for p in graph.parameters if p.name == "fc.weight"]
    assert fc_weight.nodes == (segments.backward_of(fc),)
    assert all(n.compute_ms > 0 for n in graph.nodes[1:])


def test_graph_round_trips_and_fingerprint_is_stable(resnet, tmp_path):
    model, example, graph, _ = resnet
    graph.save(tmp_path / "g.json")
    assert TrainingGraph.load(tmp_path / "g.json").fingerprint == graph.fingerprint
    again, _ = extract(model, example, cross_entropy, repeats=1, refine=False)
    assert again.fingerprint == graph.fingerprint


class _Scratch(nn.Module):
    """``(x + 1) * 2``: the sum is a temporary nobody saves, freed before the unit ends."""

    def forward(self, x):
        return (x + 1) * 2


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS needs Linux /proc")
def test_workspace_is_the_memory_a_node_holds_only_while_it_computes():
    model = nn.Sequential(nn.Linear(256, 256), _Scratch(), nn.Linear(256, 10)).train()
    x, y = torch.randn(8192, 256), torch.randint(0, 10, (8192,))  # 8 MiB activations
    graph, segments = extract(model, (x, y), cross_entropy, repeats=1, refine=False)
    scratch = graph.nodes[2]
    assert scratch.name == "1"
    assert scratch.bytes == x.nbytes  # its output only: add and mul by a constant save nothing
    assert 0.9 * x.nbytes <= scratch.workspace_bytes <= 1.6 * x.nbytes  # the temporary x + 1
    last = graph.nodes[3]
    assert last.workspace_bytes < 0.25 * x.nbytes  # a Linear to 10 classes needs no scratch of that size


def test_extraction_leaves_model_and_rng_untouched():
    torch.manual_seed(0)
    model = TinyUNet().train()
    before = copy.deepcopy(model.state_dict())
    example = unet_example()
    rng = torch.get_rng_state()
    extract(model, example, cross_entropy, repeats=1, refine=False)
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())


def test_skip_connections_cross_segments():
    graph, segments = extract(TinyUNet().train(), unet_example(), cross_entropy, repeats=1, refine=False)
    names = [n.name for n in graph.nodes]
    enc1 = names.index("enc1.2")  # conv, BN, then its in-place ReLU run out-of-place as a unit of its own
    dec1 = names.index("dec1.0")         # torch.cat([up1(d2), e1]) is glue of dec1's first unit
    assert (enc1, dec1) in graph.edges
    # enc1's gradient is the sum of what dec1 and pool hand back, in plain autograd's order: dec1's backward
    # leaves its part, pool's backward starts from it and leaves the sum, which enc1's backward reads
    grad_enc1, grad_pool, grad_dec1 = (segments.backward_of(n) for n in (enc1, enc1 + 1, dec1))
    assert grad_pool in graph.predecessors[grad_enc1] and grad_dec1 not in graph.predecessors[grad_enc1]
    assert grad_dec1 in graph.predecessors[grad_pool]
    assert names.count("pool") == 1 and names.count("pool#2") == 1  # one module called twice


def test_a_gradient_passed_straight_through_stays_with_the_node_that_made_it():
    torch.manual_seed(0)
    graph, segments = extract(PassThrough().train(), fan_in_example(), cross_entropy, repeats=1,
                              segments=PASS_THROUGH_CUT, refine=False)
    names = [n.name for n in graph.nodes]
    b, add, head = (names.index(n) for n in ("b", "join:add", "head"))
    grad_b, grad_add, grad_head = (segments.backward_of(n) for n in (b, add, head))
    # the add's backward hands head's gradient on to both its inputs: it holds no copy of it ...
    assert graph.nodes[grad_add].bytes == 0 and graph.nodes[grad_head].bytes > 0
    # ... so b's backward, which reads it (through the add's backward), needs head's backward resident too
    assert {grad_add, grad_head} <= set(graph.predecessors[grad_b])


def test_a_view_is_taken_in_the_unit_that_uses_it_not_merged_back_into_its_maker():
    torch.manual_seed(0)
    _, segments = extract(Attending().train(), fan_in_example(), cross_entropy, repeats=1, segments=ATTENDING_CUT,
                          refine=False)
    calls = [[n.target for n in unit.nodes if n.op == "call_module"] for unit in segments.units]
    # the key's transpose joins the product that reads it: the projections stay units of their own
    assert ["attn.q"] in calls and ["attn.k"] in calls and ["attn.v"] in calls
    transposed_key = next(u for u in segments.units if any(n.target is torch.matmul or "matmul" in str(n.target)
                                                            for n in u.nodes))
    assert any("transpose" in str(n.target) for n in transposed_key.nodes)


class _HandsBack(nn.Module):
    """A dropout of probability 0 hands its input back, and a later residual add reads it again."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.drop, self.l2, self.head = nn.Linear(8, 8), nn.Dropout(0.0), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = self.drop(self.l1(x))
        return self.head(self.l2(kept) + kept)


def test_a_module_handing_its_input_back_joins_the_module_that_made_it():
    torch.manual_seed(0)
    _, segments = extract(_HandsBack().train(), fan_in_example(), cross_entropy, repeats=1, refine=False)
    calls = [[n.target for n in unit.nodes if n.op == "call_module"] for unit in segments.units]
    # joined with l2 instead, the unit would still hand the value on to the add: l2 and head would follow it in
    assert calls == [["l1", "drop"], ["l2"], ["head"]]


def test_max_nodes_merges_cheap_neighbours():
    graph, segments = extract(mlp().train(), mlp_example(), cross_entropy, max_nodes=9, repeats=1, refine=False)
    assert graph.size <= 9 and len(segments.units) == 3


def test_explicit_segments_and_their_errors():
    model = mlp()
    graph, _ = extract(model, mlp_example(), cross_entropy, segments=["0", "1", "2", "3", "4", "5", "6"], repeats=1,
                       refine=False)
    assert graph.size == 17
    with pytest.raises(ExtractionError, match="not modules"):
        extract(model, mlp_example(), cross_entropy, segments=["0", "nope"])
    with pytest.raises(ExtractionError, match="inside segment"):
        extract(TinyUNet(), unet_example(), cross_entropy, segments=["enc1", "enc1.0"])
    with pytest.raises(ExtractionError, match=r"\(inputs, targets\)"):
        extract(model, mlp_example()[0], cross_entropy)


def test_hidden_tensors_name_the_segment():
    class Wrapped:
        def __init__(self, t):
            self.t = t

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), ShowsWrapped()

        def forward(self, x):
            return self.b(Wrapped(self.a(x) * 2))

    class ShowsWrapped(nn.Module):
        def forward(self, w):
            return w.t.sum(dim=1)

    with pytest.raises(ExtractionError, match="segment 'b'"):
        extract(Model(), (torch.randn(2, 4), torch.randn(2)), lambda o, t: ((o - t) ** 2).mean())


class Gate(nn.Module):
    """Doubles its input where the input's sum is positive: Python control flow on a tensor's value."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * 2 if h.sum() > 0 else h


class GlueBranch(nn.Module):
    """The same branch written in the model's own forward, between its segments ``a`` and ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h * 2 if h.sum() > 0 else h)


class GlueScale(GlueBranch):
    """Glue that reads a parameter's value into Python: stale after an optimizer step if replayed."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * self.scale.item())


class GlueFromShapes(GlueBranch):
    """Glue that reads into Python a tensor built from shapes alone: the same for every batch of this shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = torch.tensor(x.shape[-1]).item()
        return self.b(self.a(x) / width)


def _example(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=generator) * 3, torch.randint(0, 3, (4,), generator=generator)


def _exact_on_batches(model: nn.Module, seeds, method: str = "checkpoint-all") -> None:
    """Extract ``model`` on the first batch, then run each batch through the executor against plain autograd."""
    from engine.executor import Executor
    from engine.parity import check_parity
    from agent.zoo import Workload
    from schedules.plan import plan

    graph, segments = extract(model, _example(seeds[0]), cross_entropy, repeats=1, refine=False)
    with Executor(model, segments, graph, plan(graph, "rpi4", method=method).schedule) as ex:
        for seed in seeds:
            report = check_parity(ex, Workload("model", model, *_example(seed), cross_entropy))
            assert report.exact, report.mismatched


def test_glue_that_takes_a_tensors_value_into_python_stops_where_a_batch_leaves_the_examples_path():
    """Replayed without a check, the executor followed the example's branch for every batch: silently wrong."""
    from engine.errors import InputMismatchError
    from engine.executor import Executor
    from engine.parity import check_parity
    from agent.zoo import Workload
    from schedules.plan import plan

    torch.manual_seed(0)
    model = GlueBranch().train()
    positive = {seed: bool(model.a(_example(seed)[0]).sum() > 0) for seed in range(40)}
    same = next(seed for seed in range(1, 40) if positive[seed] == positive[0])
    other = next(seed for seed in range(1, 40) if positive[seed] != positive[0])
    graph, segments = extract(model, _example(), cross_entropy, repeats=1, refine=False)
    with Executor(model, segments, graph, plan(graph, "rpi4", method="checkpoint-all").schedule) as ex:
        assert check_parity(ex, Workload("glue", model, *_example(same), cross_entropy)).exact
        state = [t.clone() for t in (*model.parameters(), *(p.grad for p in model.parameters()))]
        with pytest.raises(InputMismatchError, match=r"another path through GlueBranch\.forward.*__bool__ gave"):
            ex.step(*_example(other))
        assert all(torch.equal(a, b) for a, b in zip(state, (*model.parameters(), *(p.grad for p in model.parameters()))))


def test_glue_reading_a_parameter_into_python_stops_once_the_parameter_changed():
    from engine.errors import InputMismatchError
    from engine.executor import Executor
    from schedules.plan import plan

    model = GlueScale().train()
    graph, segments = extract(model, _example(), cross_entropy, repeats=1, refine=False)
    with Executor(model, segments, graph, plan(graph, "rpi4", method="store-all").schedule) as ex:
        ex.step(*_example(1))
        with torch.no_grad():
            model.scale.add_(0.25)  # an optimizer step: the recorded 0.5 is stale now
        with pytest.raises(InputMismatchError, match=r"item gave 0\.75 where the example gave 0\.5"):
            ex.step(*_example(1))


def test_glue_may_read_a_value_that_depends_on_neither_batch_nor_parameters():
    _exact_on_batches(GlueFromShapes().train(), [0, 1])


def test_a_branch_inside_a_segment_runs_as_written_for_every_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Gate(), nn.Linear(8, 3)).train()
    positive = {seed: bool(model[0](_example(seed)[0]).sum() > 0) for seed in range(40)}
    other = next(seed for seed in positive if positive[seed] != positive[0])  # a batch on the example's other branch
    _exact_on_batches(model, [0, other])  # checkpoint-all: the gate is recomputed too


def test_sparse_gradients_are_refused_up_front_with_what_to_do():
    class Bag(nn.Module):
        def __init__(self, sparse: bool) -> None:
            super().__init__()
            self.words, self.head = nn.Embedding(50, 8, sparse=sparse), nn.Linear(8, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.words(ids).mean(1))

    example = (torch.randint(0, 50, (4, 6)), torch.randint(0, 3, (4,)))
    with pytest.raises(ExtractionError, match=r"'words' \(Embedding\) makes sparse gradients.*sparse=False"):
        extract(Bag(sparse=True), example, cross_entropy, repeats=1)
    frozen = Bag(sparse=True)
    frozen.words.requires_grad_(False)  # no gradient at all: nothing sparse to handle
    assert extract(frozen, example, cross_entropy, repeats=1)[0].size > 0
    assert extract(Bag(sparse=False), example, cross_entropy, repeats=1)[0].size > 0


class _Box:
    """A plain object a model hands from one layer to the next, as a key/value cache is."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []


class _Keeping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, box: _Box) -> torch.Tensor:
        y = self.linear(x)
        box.kept.append(y)
        return y + sum(k.sum() for k in box.kept[:-1])


class _HandsAnObjectOn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = _Keeping(), _Keeping()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box = _Box()
        return self.second(self.first(x, box), box)


def test_an_object_carrying_tensors_between_segments_is_refused_naming_the_segment() -> None:
    with pytest.raises(ExtractionError, match="segment 'first' receives a _Box that holds tensors of this forward "
                                              "pass.*build that object inside one segment"):
        extract(_HandsAnObjectOn(), (torch.randn(4, 8), torch.randn(4, 8)), nn.functional.mse_loss, repeats=0)


def test_a_decoder_with_its_key_value_cache_on_has_it_turned_off_for_training_with_a_log_line(caplog) -> None:
    pytest.importorskip("transformers")
    from tests.engine.models import gpt2_decoder, next_token_cross_entropy, next_token_example

    model = gpt2_decoder(use_cache=True).train()
    with caplog.at_level("WARNING", logger="engine.extract"):
        graph, _ = extract(model, next_token_example(), next_token_cross_entropy, repeats=0, refine=False)
    assert model.config.use_cache is False and graph.size > 3  # as transformers' Trainer does
    assert any("key/value cache turned off for training" in r.getMessage() for r in caplog.records)
    plain, _ = extract(gpt2_decoder().train(), next_token_example(), next_token_cross_entropy, repeats=0, refine=False)
    assert plain.size == graph.size


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_zoos_decoders_extract_with_their_cache_off_and_a_next_token_batch(name) -> None:
    pytest.importorskip("transformers")
    from agent.zoo import load_workload

    workload = load_workload(name, (2, 32))
    assert workload.model.config.use_cache is False and workload.model.training
    tokens, targets = workload.example
    assert tokens.shape == targets.shape == (2, 32) and torch.equal(tokens[:, 1:], targets[:, :-1])
    graph, segments = extract(workload.model, workload.example, workload.loss_fn, repeats=0, refine=False)
    assert [u.name for u in segments.units][-1] == "lm_head" and graph.size == 2 * len(segments.units) + 3


# -- the floor: light units, the operator-level bound, the refined cut ------------------------------------
def _norm_mlp(width: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(16, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 4))


def test_the_operator_bound_is_the_largest_backward_working_set_autograd_makes():
    from engine.operator_bound import operator_bound
    torch.manual_seed(0)
    batch, width = 64, 256
    model, x, y = _norm_mlp(width).train(), torch.randn(batch, 16), torch.randint(0, 4, (batch,))
    bound = operator_bound(model, x, y, cross_entropy)
    activation = batch * width * 4
    # BatchNorm's backward: its input, the gradient of its output and of its input, and its batch statistics
    # (ReLU's needs three activations too, without statistics; parameters and their gradients never count)
    assert bound == 3 * activation + 2 * width * 4
    model.zero_grad(set_to_none=True)


def test_a_unit_whose_backward_needs_no_output_of_its_own_has_no_edge_to_its_backward():
    torch.manual_seed(0)
    model = _norm_mlp().train()
    graph, segments = extract(model, (torch.randn(64, 16), torch.randint(0, 4, (64,))), cross_entropy, repeats=1,
                              refine=False)
    names = [n.name for n in graph.nodes]
    linear, norm, relu = names.index("0"), names.index("1"), names.index("2")
    # a linear layer and a BatchNorm save their input (another unit's value) and a few statistics; a ReLU its output
    assert {linear, norm} <= segments.light and relu not in segments.light
    edges = set(graph.edges)
    assert (linear, segments.backward_of(linear)) not in edges and (norm, segments.backward_of(norm)) not in edges
    assert (relu, segments.backward_of(relu)) in edges and (linear, segments.backward_of(norm)) in edges
    assert graph.runtime_bytes == 2 * 256 * 4  # the BatchNorm's statistics, kept past a free for its backward


@pytest.mark.slow  # plans two cuts of a model to their floors (about 25 s), out of the default run to keep it short;
# the refined cut itself runs there (tests/engine/test_executor_exact.py)
def test_extract_refines_by_default_bringing_the_floor_to_the_operator_bound(tmp_path):
    from schedules.budgets import memory_lower_bound, store_all_peak
    from schedules.plan import plan
    torch.manual_seed(0)
    # large enough that activations, not the last blocks' weight-gradient workspaces, set the floor
    example = image_example(batch=16, size=64)
    model = torchvision.models.resnet18(num_classes=10).train()
    reference = copy.deepcopy(model)
    coarse, _ = extract(model, example, cross_entropy, repeats=1, refine=False)
    graph, segments = extract(model, example, cross_entropy, repeats=1)
    floor, bound = memory_lower_bound(graph), graph.operator_bound_bytes
    assert memory_lower_bound(graph) < memory_lower_bound(coarse) and floor <= 1.15 * bound
    # the default cut's floor is kept beside the refined one; a budget below both names both
    assert coarse.default_cut_floor_bytes == 0
    assert abs(graph.default_cut_floor_bytes - memory_lower_bound(coarse)) <= 0.05 * memory_lower_bound(coarse)
    message = plan(graph, "rpi4", memory_budget=floor // 2, method="checkpoint-all").message
    assert f"{floor:,} B" in message and f"{graph.default_cut_floor_bytes:,} B" in message
    assert floor < 0.45 * store_all_peak(coarse) and graph.size <= 91
    # the blocks are cut where their backward set the floor: finer than the default cut, and recorded
    assert len(graph.cut) > len(coarse.cut) and any(name.startswith("layer1.0.") for name in graph.cut)
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name  # refinement's extractions leave the model as it was
    # a device re-cuts the model from the graph's record alone
    again = TrainingGraph.from_dict(graph.to_dict())
    assert again.cut == graph.cut and again.operator_bound_bytes == bound
    same, _ = extract(copy.deepcopy(reference), example, cross_entropy, repeats=0, segments=list(again.cut),
                      refine=False)
    assert same.fingerprint == graph.fingerprint


def test_extraction_leaves_gradients_the_caller_accumulated_as_they_were():
    torch.manual_seed(0)
    model = _norm_mlp().train()
    example = (torch.randn(64, 16), torch.randint(0, 4, (64,)))
    cross_entropy(model(example[0]), example[1]).backward()  # a step of gradient accumulation before extracting
    before = [p.grad.clone() for p in model.parameters()]
    # measures the operator-level bound with a backward of its own
    extract(model, example, cross_entropy, repeats=1, refine=False)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), before))


class _DrawsAroundItsLayer(nn.Module):
    """A layer whose own code scales by a number from NumPy's generator: cut into its operations, that code is
    glue, which the recording refuses to fix (it would draw once for every step)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * float(1.0 + np.random.rand())


def test_refining_stops_at_the_coarser_cut_where_a_finer_one_cannot_be_recorded():
    model = nn.Sequential(_DrawsAroundItsLayer()).train()  # one unit: it sets the floor, so refining cuts into it
    example = (torch.randn(8, 16), torch.randint(0, 16, (8,)))
    graph, _ = extract(model, example, cross_entropy, repeats=1)
    assert graph.cut == ("0",) and graph.default_cut_floor_bytes > 0
    with pytest.raises(ExtractionError, match="NumPy"):  # the finer cut, asked for, is refused
        extract(model, example, cross_entropy, repeats=1, segments=["0.inner", "0:ops"], refine=False)
