"""The zoo's workloads as the profile, validate and the benchmarks build them."""

from __future__ import annotations

import pytest

from agent.zoo import ZooError, load_workload
from schedules.budgets import memory_lower_bound, store_all_peak
from engine.extract import extract


def test_bert_is_cut_inside_each_layer_which_lowers_the_smallest_feasible_budget():
    work = load_workload("bert", (4, 64))
    graph, segments = extract(work.model, work.example, work.loss_fn, segments=work.segments, repeats=1, refine=False)
    names = [unit.name for unit in segments.units]
    assert "bert.encoder.layer.0.attention.self" in names and "bert.encoder.layer.3.output" in names
    whole, _ = extract(work.model, work.example, work.loss_fn, repeats=1, refine=False)  # the default cut: layers
    assert graph.size > whole.size
    assert memory_lower_bound(graph) / store_all_peak(graph) < 0.8 * memory_lower_bound(whole) / store_all_peak(whole)


def test_a_shape_the_model_cannot_take_is_refused_with_an_example():
    with pytest.raises(ZooError, match="8x128"):
        load_workload("bert", (8, 128, 3))


def test_a_factory_workload_takes_the_configured_batch_or_is_refused_saying_why():
    work = load_workload("agent.digits:digits_workload", (128, 1, 8, 8))
    assert tuple(work.inputs.shape) == (128, 1, 8, 8) and tuple(work.targets.shape) == (128,)
    assert tuple(load_workload("agent.digits:digits_workload").inputs.shape) == (16, 1, 8, 8)
    with pytest.raises(ZooError, match=r"batch is \(16, 1, 8, 8\), not the configured input \(16, 3, 8, 8\)"):
        load_workload("agent.digits:digits_workload", (16, 3, 8, 8))


def test_token_vocabulary_reads_the_input_embedding_and_is_none_without_token_input():
    import torch.nn as nn

    from agent.zoo import decoder_lm, token_vocabulary
    from tests.engine.models import bert_classifier, mlp

    assert token_vocabulary(decoder_lm("gpt2", layers=1, hidden=32, heads=2, vocab=77, positions=16)) == 77
    assert token_vocabulary(decoder_lm("llama", layers=1, hidden=32, heads=2, vocab=91, positions=16)) == 91
    assert token_vocabulary(bert_classifier(layers=1, hidden=32, heads=2, vocab=123)) == 123
    assert token_vocabulary(nn.Sequential(nn.Embedding(40, 8), nn.Linear(8, 40))) == 40
    assert token_vocabulary(nn.ModuleList([nn.Embedding(40, 8), nn.Embedding(16, 8)])) is None  # which one is unknown
    assert token_vocabulary(mlp()) is None
