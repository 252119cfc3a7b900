"""The opt-in chunked next-token loss: plain cross-entropy's values within rounding, without all the logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.chunked_loss import CHUNKED_LABEL, IGNORE_INDEX, ChunkedNextTokenLoss, chunked_cross_entropy, defer_head
from agent.errors import ZooError
from agent.holdout import evaluate
from agent.zoo import load_workload, next_token_cross_entropy

transformers = pytest.importorskip("transformers")

from tests.engine.models import gpt2_decoder, llama_decoder, next_token_example  # noqa: E402


def _plain_and_chunked(hidden, weight, targets, chunk_bytes):
    grads = []
    for loss_of in (lambda h, w: F.cross_entropy(h @ w.t(), targets, ignore_index=IGNORE_INDEX),
                    lambda h, w: chunked_cross_entropy(h, w, targets, chunk_bytes)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = loss_of(h, w)
        loss.backward()
        grads.append((loss.detach(), h.grad, w.grad))
    return grads


@pytest.mark.parametrize("tokens_per_chunk", [1, 3, 7, 100])
def test_matches_plain_cross_entropy_within_rounding_at_every_chunk_size(tokens_per_chunk):
    torch.manual_seed(0)
    hidden, weight = torch.randn(23, 16), torch.randn(50, 16)
    targets = torch.randint(0, 50, (23,))
    targets[[2, 11]] = IGNORE_INDEX  # counted as plain cross-entropy counts them: not at all
    plain, chunked = _plain_and_chunked(hidden, weight, targets, chunk_bytes=4 * 50 * tokens_per_chunk)
    for a, b in zip(plain, chunked):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert chunked[1][[2, 11]].abs().sum() == 0  # an ignored token gets no gradient


def test_a_target_shape_that_does_not_match_the_hidden_states_is_refused():
    with pytest.raises(ValueError, match=r"targets of shape \(4, 5\) do not match hidden states of shape \(4, 6, 8\)"):
        chunked_cross_entropy(torch.randn(4, 6, 8), torch.randn(10, 8), torch.zeros(4, 5, dtype=torch.long))


@pytest.mark.parametrize("make", [gpt2_decoder, llama_decoder])
def test_a_deferred_head_keeps_the_weight_its_key_and_eval_logits(make):
    torch.manual_seed(0)
    plain = make().train()
    torch.manual_seed(0)
    model = defer_head(make().train())
    assert list(model.state_dict()) == list(plain.state_dict())  # checkpoints and federated updates unchanged
    if make is gpt2_decoder:
        assert model.get_output_embeddings().weight is model.transformer.wte.weight  # still tied
    tokens, targets = next_token_example()
    assert model(tokens).logits.shape[-1] == 64  # training: the hidden states, for the loss to project
    model.eval(), plain.eval()
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, plain(tokens).logits)  # eval: the head again
        loss = ChunkedNextTokenLoss.of(model)(model(tokens), targets)
        assert torch.equal(loss, next_token_cross_entropy(plain(tokens), targets))


def test_training_on_the_chunked_loss_follows_plain_training_within_rounding():
    torch.manual_seed(0)
    plain = gpt2_decoder().train()
    torch.manual_seed(0)
    model = defer_head(gpt2_decoder().train())
    loss_fn = ChunkedNextTokenLoss.of(model, chunk_bytes=4 * 128 * 5)
    tokens, targets = next_token_example(4, 16)
    torch.manual_seed(1)
    next_token_cross_entropy(plain(tokens), targets).backward()
    torch.manual_seed(1)  # the same dropout masks
    loss_fn(model(tokens), targets).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_chunked_workload_is_named_so_and_evaluates_on_real_logits(tmp_path):
    from agent.data import LocalDataset

    plain = load_workload("gpt2", (2, 16), seed=0)
    chunked = load_workload("gpt2", (2, 16), seed=0, chunked_loss=True)
    assert chunked.name == "gpt2" + CHUNKED_LABEL == "gpt2 (chunked loss)"
    tokens = torch.randint(0, 2048, (10, 17))
    data = LocalDataset(train_x=tokens[:6, :-1], train_y=tokens[:6, 1:], holdout_x=tokens[6:, :-1],
                        holdout_y=tokens[6:, 1:], batch_size=2, seed=0, source=tmp_path / "tokens.npy")
    a, b = evaluate(plain.model, plain.loss_fn, data), evaluate(chunked.model, chunked.loss_fn, data)
    assert (a.loss, a.accuracy) == (b.loss, b.accuracy) and a.accuracy is not None
    assert chunked.model.training  # evaluation restored training mode, and with it the deferred head


def test_a_chunked_loss_for_a_model_without_a_language_head_is_refused():
    with pytest.raises(ZooError, match="chunked loss for resnet18: ResNet with its loss cannot be chunked"):
        load_workload("resnet18", (2, 3, 32, 32), chunked_loss=True)


def test_a_batch_of_ignored_targets_gives_zero_gradients_as_plain_cross_entropy_does():
    hidden, weight = torch.randn(2, 5, 8, requires_grad=True), torch.randn(30, 8, requires_grad=True)
    loss = chunked_cross_entropy(hidden, weight, torch.full((2, 5), IGNORE_INDEX), chunk_bytes=4 * 30 * 3)
    loss.backward()
    assert torch.isnan(loss)  # as F.cross_entropy's mean over no targets
    assert torch.equal(hidden.grad, torch.zeros_like(hidden)) and torch.equal(weight.grad, torch.zeros_like(weight))


def test_float64_hidden_states_are_reduced_in_float64():
    torch.manual_seed(0)
    hidden, weight = torch.randn(6, 4, dtype=torch.float64), torch.randn(9, 4, dtype=torch.float64)
    targets = torch.randint(0, 9, (6,))
    assert torch.autograd.gradcheck(lambda h, w: chunked_cross_entropy(h, w, targets, chunk_bytes=4 * 9 * 2),
                                    (hidden.requires_grad_(), weight.requires_grad_()))
