"""LoRA adapters through peft: the agent's steps equal plain peft training bit for bit, the plan holds gradients
and optimizer state of the adapters only, only adapters leave a federated device, and export merges them."""

from __future__ import annotations

import uuid
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from agent.config import load_config  # noqa: E402
from agent.errors import ConfigError  # noqa: E402
from agent.prepare import build_workload, prepare  # noqa: E402
from tests.agent.daemon_helpers import FakeDevice, _write_config, write_csv  # noqa: E402
from tests.engine.test_executor_exact import SCHEDULES, assert_exact  # noqa: E402


def _config(tmp_path: Path, model: str = "tests.engine.models:mlp", input: str = "8x32", **overrides):
    device = FakeDevice(tmp_path / "root")
    lora = {"workload_adapters": "lora", "workload_lora_rank": 4, "workload_lora_alpha": 8.0,
            "workload_lora_dropout": 0.1, "workload_lora_targets": ["0", "3", "6"]}
    path = _write_config(tmp_path, device, write_csv(tmp_path / "data.csv"), model, input,
                         training_memory_budget="1GB", training_optimizer="adamw", **{**lora, **overrides})
    return load_config(path)


@pytest.mark.parametrize("schedule", ["recompute", pytest.param("paging", marks=pytest.mark.slow)])
def test_lora_steps_are_bit_identical_to_plain_peft_training(tmp_path: Path, schedule: str) -> None:
    pytest.importorskip("transformers")
    config = _config(tmp_path, model="gpt2", input="2x16", workload_lora_targets=["c_attn", "c_proj"])
    workload = build_workload(config)
    assert workload.name == "gpt2+lora"
    batch = (workload.inputs, workload.targets)
    # the executor's model and a deep copy trained by plain autograd and Adam, dropout in the adapters included
    assert_exact(lambda: build_workload(config).model, lambda: batch, workload.loss_fn, SCHEDULES[schedule],
                 tmp_path / "swap", optimizer="adam")


def test_the_plan_holds_gradients_and_optimizer_state_of_the_adapters_only(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = _config(tmp_path)
    prepared = prepare(config)
    model = prepared.workload.model
    adapters = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in name for name in adapters)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert frozen > sum(p.numel() for p in adapters.values())  # the base is most of the model
    planned = {p.name: p.bytes for p in prepared.graph.parameters}
    assert sum(planned.values()) == sum(p.nbytes for p in adapters.values())  # gradients of the adapters only


def test_only_adapters_leave_a_federated_device_and_export_merges_them(tmp_path: Path) -> None:
    from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict

    from agent.federated import clientapp as client
    from common.cli import main

    torch.set_num_threads(1)
    config = _config(tmp_path, device_name="pi-lora")
    context = Context(run_id=1, node_id=7, state=RecordDict(), node_config={"agent-config": str(config.path),
                                                                              "device-name": "pi-lora"},
                      run_config={"num-server-rounds": 1, "min-nodes": 1, "local-steps": 2, "finetune-steps": 2,
                                  "lr": 0.05, "personalization": "finetune", "seed": 0, "database-url": ""})

    def ask(kind: str, content: RecordDict) -> Message:
        metadata = Metadata(run_id=1, message_id=uuid.uuid4().hex, src_node_id=0, dst_node_id=7,
                            reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0,
                            message_type=kind)
        reply = client.app(Message(content=content, metadata=metadata), context)
        assert not reply.has_error(), reply.error
        return reply

    initial = ask("query.initial", RecordDict({"config": ConfigRecord()})).content["arrays"]
    model = build_workload(config).model
    adapters = {name for name, p in model.named_parameters() if p.requires_grad}
    assert set(initial.keys()) == adapters  # the frozen base never leaves the device
    trained = ask("train", RecordDict({"arrays": initial, "config": ConfigRecord({"local-steps": 2, "lr": 0.05})}))
    assert set(trained.content["arrays"].keys()) == adapters
    ask("train.personalize", RecordDict({"arrays": trained.content["arrays"],
                                         "config": ConfigRecord({"finetune-steps": 2, "lr": 0.05})}))

    out = tmp_path / "merged.pt"
    assert main(["agent", "export", "--config", str(config.path), "--out", str(out)]) == 0
    exported = torch.jit.load(str(out))
    assert not any("lora" in name for name, _ in exported.named_parameters())  # merged into the base weights
    from agent.personal_model import load

    _, kept = load(config.device.state_dir)
    model.load_state_dict(kept)
    model.eval()
    batch = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.allclose(exported(batch), model(batch), atol=1e-5)  # merging rounds: not bit for bit


def test_adapter_settings_are_checked(tmp_path: Path) -> None:
    for overrides, says in (({"workload_adapters": "prefix"}, "workload.adapters = 'prefix': one of none, lora"),
                            ({"workload_lora_rank": 0}, "lora_rank must be at least 1"),
                            ({"workload_lora_dropout": 1.0}, "lora_dropout must be in"),
                            ({"workload_lora_targets": "q_proj"}, "list of module names")):
        with pytest.raises(ConfigError, match=says):
            _config(tmp_path, **overrides)
