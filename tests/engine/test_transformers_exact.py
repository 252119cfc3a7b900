"""transformers models users bring, built from a config: BART and Whisper, whose learned positional embeddings
subclass ``nn.Embedding`` but look up positions, not the ids they are called with; Wav2Vec2 with its default
SpecAugment, whose masks come from NumPy's global generator."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agent.zoo import Workload
from engine.executor import Executor
from engine.errors import ExtractionError
from engine.extract import extract
from engine.optim.rows import row_updatable
from engine.parity import check_parity
from tests.engine.models import page_everything, recompute_everything, schedule_for

transformers = pytest.importorskip("transformers")
VOCAB, LENGTH = 100, 16  # token ids past the 32 positions, as every real checkpoint's are


def _loss(output, targets: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def bart() -> Workload:
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=32, dropout=0.1, use_cache=False)
    model = transformers.BartForConditionalGeneration(config).train()
    ids = torch.randint(3, VOCAB, (2, LENGTH))
    return Workload("bart", model, (ids, torch.ones_like(ids), torch.randint(3, VOCAB, (2, LENGTH))),
                    torch.randint(3, VOCAB, (2, LENGTH)), _loss)


def whisper() -> Workload:
    torch.manual_seed(0)
    config = transformers.WhisperConfig(vocab_size=VOCAB, d_model=64, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                                        max_target_positions=32, use_cache=False, pad_token_id=0,
                                        decoder_start_token_id=1, eos_token_id=2, bos_token_id=1)
    model = transformers.WhisperForConditionalGeneration(config).train()
    features = torch.randn(2, 8, 2 * 16)  # mel bins x frames: two frames a position
    return Workload("whisper", model, (features, None, torch.randint(3, VOCAB, (2, LENGTH))),
                    torch.randint(3, VOCAB, (2, LENGTH)), _loss)


@pytest.mark.parametrize("schedule_of", [recompute_everything, page_everything])
@pytest.mark.parametrize("make", [bart, whisper])
def test_learned_positional_embeddings_train_bit_identically(make, schedule_of, tmp_path) -> None:
    workload = make()
    learned = [m for n, m in workload.model.named_modules()
               if n.endswith("embed_positions") and type(m) is not torch.nn.Embedding]
    assert learned and not any(row_updatable(m) for m in learned)  # they look up positions, not the ids
    graph, segments = extract(workload.model, workload.example, workload.loss_fn, repeats=1, refine=False)
    with Executor(workload.model, segments, graph, schedule_for(graph, schedule_of(graph)), swap_dir=tmp_path) as ex:
        report = check_parity(ex, workload)
    assert report.exact, report.mismatched


def test_a_plain_embedding_table_is_still_updated_by_rows() -> None:
    assert row_updatable(torch.nn.Embedding(100, 64))


def wav2vec2(spec_augment: bool = True) -> Workload:
    """Its default config's SpecAugment (``apply_spec_augment``, ``mask_time_prob`` 0.05): masks drawn from
    NumPy's global generator in the model's own forward, outside every module it is cut into."""
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                         conv_kernel=(10, 3), num_feat_extract_layers=2, mask_time_length=2,
                                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                                         apply_spec_augment=spec_augment)
    model = transformers.Wav2Vec2Model(config).train()
    return Workload("wav2vec2", model, torch.randn(2, 1600), torch.randn(2, 32),
                    lambda output, targets: F.mse_loss(output.last_hidden_state.mean(1), targets))


def test_wav2vec2s_default_spec_augment_is_refused_naming_the_setting_not_trained_differently() -> None:
    workload = wav2vec2()
    assert workload.model.config.apply_spec_augment and workload.model.config.mask_time_prob > 0  # the defaults
    with pytest.raises(ExtractionError, match=r"Wav2Vec2Model's own code.*draws from NumPy's global generator.*"
                                              r"config.apply_spec_augment = False"):
        extract(workload.model, workload.example, workload.loss_fn, repeats=0, refine=False)


@pytest.mark.parametrize("schedule_of", [recompute_everything, page_everything])
def test_wav2vec2_without_spec_augment_trains_bit_identically(schedule_of, tmp_path) -> None:
    workload = wav2vec2(spec_augment=False)
    graph, segments = extract(workload.model, workload.example, workload.loss_fn, repeats=1, refine=False)
    with Executor(workload.model, segments, graph, schedule_for(graph, schedule_of(graph)), swap_dir=tmp_path) as ex:
        report = check_parity(ex, workload)
    assert report.exact, report.mismatched
