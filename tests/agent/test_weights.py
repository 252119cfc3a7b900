"""Pretrained weights: a state dict file or a save_pretrained folder is what the workload starts from, weights
for another model are refused before anything is copied, and a checkpoint never resumes other weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from agent.config import load_config
from agent.errors import CheckpointError, ConfigError, WeightsError
from agent.prepare import build_workload, prepare, workload_key
from agent.weight_files import fingerprint
from agent.weights import load_weights
from tests.agent.daemon_helpers import MODEL, FakeDevice, _write_config, write_csv
from tests.engine.models import mlp


def _config(tmp_path: Path, model: str = MODEL, input: str = "8x32", **overrides):
    device = FakeDevice(tmp_path / "root")
    path = _write_config(tmp_path, device, write_csv(tmp_path / "data.csv"), model, input,
                         training_memory_budget="1GB", **overrides)
    return load_config(path)


def _trained_elsewhere() -> dict[str, torch.Tensor]:
    """Weights of the test MLP that no seed of the agent's makes."""
    torch.manual_seed(1234)
    return {k: v.clone() for k, v in mlp().state_dict().items()}


def _save(state: dict[str, torch.Tensor], path: Path) -> Path:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_state_dict_file_is_what_the_workload_starts_from(tmp_path: Path, suffix: str) -> None:
    pretrained = _trained_elsewhere()
    weights = _save(pretrained, tmp_path / f"pretrained{suffix}")
    seeded = build_workload(_config(tmp_path)).model.state_dict()
    assert not all(torch.equal(seeded[k], v) for k, v in pretrained.items())  # the seed alone is another model

    started = build_workload(_config(tmp_path, workload_weights=str(weights))).model.state_dict()

    assert all(torch.equal(started[k], v) for k, v in pretrained.items())


def test_weights_for_another_model_are_refused_naming_what_differs_and_nothing_is_copied(tmp_path: Path) -> None:
    state = _trained_elsewhere()
    state["0.weight"] = torch.zeros(64, 16)  # the first layer takes 16 features, not 32
    state["head.weight"] = torch.zeros(5, 64)  # a name the model does not have
    del state["6.bias"]  # one it does have
    weights = _save(state, tmp_path / "other.pt")
    model = mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}

    with pytest.raises(WeightsError) as refused:
        load_weights(model, weights)

    message = str(refused.value)
    assert "0.weight (64, 16) (the model's (64, 32))" in message
    assert "not in the model: head.weight" in message and "missing: 6.bias" in message
    assert str(weights) in message
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # not half-loaded


def test_files_that_are_not_state_dicts_are_clear_errors(tmp_path: Path) -> None:
    good = _save(_trained_elsewhere(), tmp_path / "good.safetensors")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:200])
    not_a_dict = tmp_path / "list.pt"
    torch.save([torch.zeros(3)], not_a_dict)
    code = tmp_path / "code.pt"
    torch.save({"0.weight": torch.zeros(3), "activation": nn.ReLU()}, code)  # a module: code, not weights

    for path, says in ((cut, "not a readable safetensors file"), (not_a_dict, "not a state dict"),
                       (code, "weights_only=True"), (tmp_path / "weights.npz", "unknown kind of file")):
        if path.suffix == ".npz":
            path.write_bytes(b"x")
        with pytest.raises(WeightsError, match=says):
            load_weights(mlp(), path)


def test_a_save_pretrained_folder_builds_its_own_model_with_its_tied_weights(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    saved = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                       tie_word_embeddings=True))
    saved.save_pretrained(tmp_path / "tiny-gpt2")
    config = _config(tmp_path, model="", input="2x16", workload_weights=str(tmp_path / "tiny-gpt2"))

    workload = build_workload(config)

    model = workload.model
    assert type(model) is GPT2LMHeadModel and model.training and model.config.use_cache is False
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.state_dict().items())
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # still one tensor
    assert tuple(workload.inputs.shape) == (2, 16) and torch.equal(workload.targets[:, :-1], workload.inputs[:, 1:])
    loss = workload.loss_fn(model(workload.inputs), workload.targets)
    assert 3.0 < loss.item() < 5.5  # about ln(64): next-token cross-entropy over the folder's vocabulary

    # the zoo's gpt2 is another size: its shapes are named, not loaded
    with pytest.raises(WeightsError, match="shapes differ: lm_head.weight|shapes differ: transformer"):
        build_workload(_config(tmp_path, model="gpt2", input="2x16", workload_weights=str(tmp_path / "tiny-gpt2")))


def test_the_config_says_what_is_wrong_with_the_weights(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    cases = [({"workload_weights": str(tmp_path / "absent.pt")}, "does not exist"),
             ({"workload_weights": str(tmp_path / "folder")}, "without config.json"),
             ({"workload_model": ""}, "workload.model is required")]
    for overrides, says in cases:
        with pytest.raises(ConfigError, match=says):
            _config(tmp_path, **overrides)


def test_training_never_resumes_a_checkpoint_of_other_weights(tmp_path: Path) -> None:
    from agent.daemon.trainer import Trainer
    from agent.data import open_dataset

    torch.set_num_threads(1)
    weights = _save(_trained_elsewhere(), tmp_path / "pretrained.pt")
    config = _config(tmp_path, workload_weights=str(weights))
    prepared = prepare(config)
    data = open_dataset(config.data.path, (8, 32), holdout=config.data.holdout, seed=config.workload.seed)
    trainer = Trainer(config, prepared, data)
    try:
        assert prepared.weights_sha256 == fingerprint(weights)
        assert trainer.store.load_latest().state["weights_sha256"] == prepared.weights_sha256
        trainer.step()
        trainer.checkpoint()
    finally:
        trainer.close()

    # other weights are another workload: their own key, so their own checkpoints and profile ...
    other = _save({k: v + 1 for k, v in _trained_elsewhere().items()}, tmp_path / "pretrained.pt")
    assert workload_key(config) != prepared.key and workload_key(config, fingerprint(other)) != prepared.key
    # ... and a checkpoint of other weights, found where this workload's should be, is refused
    elsewhere = dataclasses.replace(prepared, weights_sha256=fingerprint(other))
    resumed = Trainer(config, elsewhere, data, store=trainer.store)
    try:
        with pytest.raises(CheckpointError, match="started from pretrained weights .* move .* aside"):
            resumed.restore()
        assert resumed.steps_done == 0
    finally:
        resumed.close()


def test_a_model_without_tied_weights_must_have_every_tensor(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    state = {k: v for k, v in model.state_dict().items() if k != "1.weight"}
    with pytest.raises(WeightsError, match="missing: 1.weight"):
        load_weights(model, _save(state, tmp_path / "partial.pt"))


def test_agent_export_makes_an_inference_model_of_any_weights_file(tmp_path: Path, capsys) -> None:
    from common.cli import main
    from common.exit_codes import ExitCode

    pretrained = _trained_elsewhere()
    weights = _save(pretrained, tmp_path / "global-v3.safetensors")
    config = _config(tmp_path)
    out = tmp_path / "model.pt"

    assert main(["agent", "export", "--config", str(config.path), "--weights", str(weights), "--out", str(out)]) == 0

    exported = torch.jit.load(str(out))
    model = mlp().eval()
    model.load_state_dict(pretrained)
    batch = torch.randn(4, 32)
    assert torch.equal(exported(batch), model(batch))
    wrong = _save({"0.weight": torch.zeros(2, 2)}, tmp_path / "wrong.pt")
    assert main(["agent", "export", "--config", str(config.path), "--weights", str(wrong),
                 "--out", str(tmp_path / "wrong-model.pt")]) == ExitCode.BAD_FILE
    assert "are not for this model" in capsys.readouterr().err and not (tmp_path / "wrong-model.pt").exists()
