"""Held-out loss and accuracy: per sample, per pixel and per token, each on its own class axis."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agent.data import LocalDataset, open_dataset
from agent.holdout import evaluate
from agent.zoo import next_token_cross_entropy


class NextIsPlusOne(nn.Module):
    """Scores that name ``id + 1`` (modulo the vocabulary) as every position's next token, one-hot: a
    transformers-style output (``.logits``, ``(B, L, V)``) or a bare tensor in torch's layout (``(B, V, L)``)."""

    def __init__(self, vocab: int, transformers_output: bool = True) -> None:
        super().__init__()
        self.vocab, self.transformers_output = vocab, transformers_output

    def forward(self, ids: torch.Tensor):
        logits = F.one_hot((ids + 1) % self.vocab, self.vocab).float()                   # B, L, V
        return SimpleNamespace(logits=logits) if self.transformers_output else logits.transpose(1, 2)  # B, V, L


def _windows(tmp_path: Path, windows: list[list[int]], length: int, holdout: float = 0.5) -> LocalDataset:
    np.save(tmp_path / "ids.npy", np.array(windows))
    return open_dataset(tmp_path / "ids.npy", (2, length), holdout=holdout, seed=1)


def _one_hot_loss(vocab: int, right: int, wrong: int) -> float:
    """Mean cross-entropy of one-hot scores (1 for one class, 0 for the rest) over right and wrong guesses."""
    norm = math.log(math.e + vocab - 1)
    return (right * (norm - 1) + wrong * norm) / (right + wrong)


def test_next_token_accuracy_counts_tokens_over_the_vocabulary_axis(tmp_path) -> None:
    # every window k, k+1, k+2, 0: inputs k, k+1, k+2 are followed by k+1, k+2, 0; the model guesses k+3 last
    data = _windows(tmp_path, [[k, k + 1, k + 2, 0] for k in range(1, 9)], 3)
    model = NextIsPlusOne(vocab=16).train()

    result = evaluate(model, next_token_cross_entropy, data)

    assert result.samples == 4 and result.accuracy == 2 / 3  # 8 of 12 held-out tokens
    assert math.isclose(result.loss, _one_hot_loss(16, right=2, wrong=1), rel_tol=1e-6)
    assert model.training  # its mode is restored


def test_a_sequence_as_long_as_the_vocabulary_keeps_each_layout_s_own_class_axis(tmp_path) -> None:
    # vocabulary 3, sequences of 3: (B, L, V) and (B, V, L) both fit the targets' shape; the scores on the
    # other axis would name [2, 0, 1] where the targets are [1, 2, 2]: no token right
    data = _windows(tmp_path, [[0, 1, 2, 2]] * 4, 3)

    transformers_style = evaluate(NextIsPlusOne(3), next_token_cross_entropy, data)
    torch_style = evaluate(NextIsPlusOne(3, transformers_output=False), F.cross_entropy, data)

    assert transformers_style.accuracy == torch_style.accuracy == 2 / 3
    assert math.isclose(transformers_style.loss, torch_style.loss, rel_tol=1e-6)


def test_classes_per_sample_and_per_pixel_stay_on_axis_one(tmp_path) -> None:
    labels = torch.tensor([0, 1, 2, 1, 0, 2])
    pixels = torch.tensor([[[0, 1, 1], [2, 2, 0]]] * 6)                                  # B, H, W: 6 x 2 x 3
    scores = {"sample": lambda x: F.one_hot(torch.where(x[:, 0] == 2, 0, x[:, 0]), 3).float(),   # 2 read as 0
              "pixel": lambda x: F.one_hot(x.clamp(max=1), 3).permute(0, 3, 1, 2).float()}  # B, 3, H, W; 2 as 1

    class Scores(nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scores[self.kind](x)

    def held_out(x: torch.Tensor, y: torch.Tensor) -> LocalDataset:
        return LocalDataset(train_x=x[:0], train_y=y[:0], holdout_x=x, holdout_y=y, batch_size=4, seed=0,
                            source=tmp_path)

    per_sample = evaluate(Scores("sample"), F.cross_entropy, held_out(labels[:, None], labels))
    per_pixel = evaluate(Scores("pixel"), F.cross_entropy, held_out(pixels, pixels))

    assert per_sample.accuracy == 4 / 6 and per_sample.samples == 6  # the two 2s are missed
    assert per_pixel.accuracy == 4 / 6  # each image's two 2s are missed


def test_float_targets_have_a_loss_and_no_accuracy(tmp_path) -> None:
    x = torch.arange(6, dtype=torch.float32)[:, None]
    data = LocalDataset(train_x=x[:0], train_y=x[:0], holdout_x=x, holdout_y=x + 1, batch_size=4, seed=0,
                        source=tmp_path)

    result = evaluate(nn.Identity(), F.mse_loss, data)

    assert result.accuracy is None and result.loss == 1.0
