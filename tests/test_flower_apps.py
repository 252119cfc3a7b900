"""The Flower apps: ``agent.federated.clientapp:app`` on virtual devices, ``server.federated.serverapp:app`` over them.

The round trip runs in Flower's simulation engine (a SuperLink with ``--simulation``, virtual SuperNodes on
Ray; :mod:`simulation.engine`).  The other tests hand the ClientApp messages directly, as the SuperNode
would, and inspect exactly what it replies: a reply is what leaves the device.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict  # noqa: E402

from agent.holdout import holdout_halves  # noqa: E402
from agent.federated import clientapp as client  # noqa: E402
from common.keep_best import CANDIDATES, SWITCH_SAMPLES, kept_name  # noqa: E402
from agent.errors import FederationError  # noqa: E402
from agent.federated.task import METRIC_KEYS  # noqa: E402
from agent.personalization import strategy  # noqa: E402
from engine.parity import bits_equal  # noqa: E402
from engine.training import DEFAULT_TOLERANCE_BYTES  # noqa: E402
from server.config import ServerSettings  # noqa: E402
from server.errors import ServerConfigError  # noqa: E402
from server.federated.serverapp import federation_config, pooled_choice  # noqa: E402
from server.keys import load_or_create  # noqa: E402
from server.model_versions import list_versions, load_version  # noqa: E402
from server.federated.rounds import open_store, round_rows  # noqa: E402
from simulation.engine import run_on_engine  # noqa: E402
from simulation.fleet import DEFAULT_CLASSES, fleet_node_configs  # noqa: E402

SUPERLINK_NODE_ID = 0  # the source of every instruction a SuperNode receives


def run_config(**changes) -> dict:
    config = {"num-server-rounds": 2, "min-nodes": 3, "local-steps": 3, "finetune-steps": 4, "lr": 0.05,
              "personalization": "finetune", "seed": 0, "database-url": "",
              "device-classes": "small=rpi4:0.9,medium=rpi5:0.95,large=jetson-orin-nano:1"}
    return {**config, **changes}


@pytest.mark.slow  # two runs on Flower's simulation engine (about 2 minutes), out of the default run to keep it short;
# tests/simulation's first test runs the engine there
def test_a_round_trip_in_the_simulation_engine_stores_a_row_per_device_per_round(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    data_dir = tmp_path / "server"
    scratch = tmp_path / "engine"
    scratch.mkdir()
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # earlier tests' helpers, not ours
    run_id = run_on_engine(run_config(**{"database-url": url, "data-dir": str(data_dir)}), devices=3,
                           cpus_per_device=1, scratch=scratch)
    rows = round_rows(open_store(url), run_id)
    counts = {(phase, r): sum(1 for x in rows if (x.phase, x.round) == (phase, r))
              for phase, r in [("train", 1), ("evaluate", 1), ("train", 2), ("evaluate", 2), ("personalize", 3),
                               ("keep", 3)]}
    assert set(counts.values()) == {3}, counts
    assert {r.device_name for r in rows} == {n["device-name"] for n in fleet_node_configs(3, DEFAULT_CLASSES)}
    nodes = {r.node_id for r in rows}  # src_node_id of each reply: one per virtual SuperNode, not the SuperLink's
    assert len(nodes) == 3 and SUPERLINK_NODE_ID not in nodes
    trained = [r for r in rows if r.phase == "train"]
    assert all(r.schedule_id and r.metrics["steps"] == 3 for r in trained)
    for r in trained:
        if r.metrics["budget-bytes"] > 0:
            assert 0 < r.metrics["peak-bytes"] <= r.metrics["budget-bytes"] + DEFAULT_TOLERANCE_BYTES
    final = [r for r in rows if r.phase == "personalize"]
    assert all(0 <= r.metrics["global-accuracy"] <= 1 and 0 <= r.metrics["personal-accuracy"] <= 1 for r in final)
    # the server pooled the devices' selection halves: every device keeps the candidate the fleet chose
    kept = {r.device_name: r.metrics for r in rows if r.phase == "keep"}
    assert len({m["kept"] for m in kept.values()}) == 1 and all(m["kept-by-fleet"] == 1 for m in kept.values())
    assert kept_name(next(iter(kept.values()))["kept"]) == pooled_choice(final)
    assert all(m["kept-accuracy"] == m[f"{kept_name(m['kept'])}-accuracy"] for m in kept.values())
    # each round's global model is a signed version, chained to the one before; the devices personalized the last
    database = open_store(url)
    versions = list_versions(database, run_id=str(run_id))
    assert [(v.round, v.parent) for v in versions] == [(2, versions[1].version), (1, None)]
    assert versions[0].metrics["evaluate.accuracy"] == pytest.approx(
        sum(r.metrics["accuracy"] * r.metrics["num-examples"] for r in rows if (r.phase, r.round) == ("evaluate", 2))
        / sum(r.metrics["num-examples"] for r in rows if (r.phase, r.round) == ("evaluate", 2)))
    assert {r.metrics["global-version"] for r in final} == {versions[0].version}
    key = load_or_create(ServerSettings(data_dir=data_dir).keys_dir).private_key.public_key()
    assert load_version(database, data_dir, key)[0] == versions[0]
    # a new run starts from the newest version: its first round's parent
    again = run_on_engine(run_config(**{"database-url": url, "data-dir": str(data_dir), "num-server-rounds": 1,
                                        "personalization": "none"}), devices=3, cpus_per_device=1, scratch=scratch)
    assert [(v.round, v.parent) for v in list_versions(database, run_id=str(again))] == [(1, versions[0].version)]
    # nothing outlives the runs: no SuperLink, SuperExec, Ray raylet or gcs_server
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(scratch) in " ".join(p.info["cmdline"] or ())]


class Device:
    """One virtual device as Flower's simulation engine runs it: its node config and the state it keeps."""

    def __init__(self, partition: int, partitions: int = 3, node_config: dict | None = None, **run_changes) -> None:
        self.node_id = 1000 + partition
        node = node_config or {"partition-id": partition, "num-partitions": partitions}
        self.context = Context(run_id=1, node_id=self.node_id, state=RecordDict(), run_config=run_config(**run_changes),
                               node_config=node)

    def ask(self, message_type: str, content: RecordDict) -> Message:
        """The device's reply to one instruction from the server (built as the SuperNode delivers it)."""
        metadata = Metadata(run_id=1, message_id=uuid.uuid4().hex, src_node_id=SUPERLINK_NODE_ID,
                            dst_node_id=self.node_id, reply_to_message_id="", group_id="1", created_at=time.time(),
                            ttl=3600.0, message_type=message_type)
        reply = client.app(Message(content=content, metadata=metadata), self.context)
        assert not reply.has_error(), reply.error
        return reply


def weights_message(arrays: ArrayRecord, **config) -> RecordDict:
    return RecordDict({"arrays": arrays, "config": ConfigRecord({"local-steps": 3, "lr": 0.05, **config})})


def test_metric_keys_are_the_same_from_devices_of_every_budget() -> None:
    initial = ArrayRecord(client.task_for(0).initial)
    devices = [Device(i) for i in range(3)]
    replies = [d.ask(phase, weights_message(initial)) for d in devices for phase in ("train", "evaluate")]
    assert all(tuple(m.content["metrics"].keys()) == METRIC_KEYS for m in replies)
    budgets = {m.content["metrics"]["budget-bytes"] for m in replies}
    assert len(budgets) == 3 and -1 in budgets  # three classes: two budgets and no limit (-1)
    names = {str(m.content["device"]["device-name"]) for m in replies}
    assert names == {n["device-name"] for n in fleet_node_configs(3, DEFAULT_CLASSES)}  # derived as the report does


@pytest.mark.parametrize("personalization", ["fedper", "fedbn"])
def test_personal_layers_never_appear_in_a_message(personalization) -> None:
    personal = strategy(personalization).personal_keys(client.task_for(0).model)
    assert personal and all(k.startswith("head.") for k in personal) == (personalization == "fedper")
    devices = [Device(i, personalization=personalization) for i in range(2)]
    sent = [devices[0].ask("query.initial", RecordDict({"config": ConfigRecord()}))]
    weights = sent[0].content["arrays"]
    for _ in range(2):  # two rounds; the devices keep their personal layers between them
        replies = [d.ask("train", weights_message(weights)) for d in devices]
        sent += replies
        weights = replies[0].content["arrays"]  # stands in for the aggregate: shared layers only
    sent += [d.ask("train.personalize", weights_message(weights, **{"finetune-steps": 4})) for d in devices]
    records = [a for m in sent for a in m.content.array_records.values()]
    assert len(records) == 5  # initial weights, 2 rounds x 2 train replies; personalize sends metrics only
    for record in records:
        assert not personal & set(record.keys()), sorted(personal & set(record.keys()))
    kept = [d.context.state[client.PERSONAL] for d in devices]
    assert all(set(r.keys()) == personal for r in kept)  # ... and each device holds its own
    heads = [r.to_torch_state_dict() for r in kept]
    assert any(not bits_equal(heads[0][k], heads[1][k]) for k in personal)  # trained apart, so they differ


def train_reply(budget_fraction: float) -> dict:
    """Device 0's weights after one train message, as sent, under ``budget_fraction`` of the plain peak."""
    device = Device(0, personalization="none", **{"device-classes": f"c=rpi4:{budget_fraction}"})
    reply = device.ask("train", weights_message(ArrayRecord(client.task_for(0).initial), **{"local-steps": 6}))
    return {"weights": reply.content["arrays"].to_torch_state_dict(), "metrics": dict(reply.content["metrics"]),
            "schedule": reply.content["device"]["schedule-id"]}


def test_the_same_seed_trains_bit_identical_weights_with_and_without_a_memory_budget() -> None:
    free, bounded = train_reply(1.0), train_reply(0.9)
    assert free["schedule"] != bounded["schedule"]  # a different schedule, within a budget ...
    assert bounded["metrics"]["budget-bytes"] > 0 and free["metrics"]["budget-bytes"] == -1
    assert 0 < bounded["metrics"]["peak-bytes"] <= bounded["metrics"]["budget-bytes"] + DEFAULT_TOLERANCE_BYTES
    assert free["weights"].keys() == bounded["weights"].keys()
    for key in free["weights"]:  # ... and the very same arithmetic
        assert bits_equal(free["weights"][key], bounded["weights"][key]), key


def test_the_server_refuses_bad_settings_listing_every_problem() -> None:
    with pytest.raises(ServerConfigError) as caught:
        federation_config({"num-server-rounds": -1, "fraction-train": 2.0, "personalization": "x",
                           "initial-version": "newest"})
    text = str(caught.value)
    assert "num-server-rounds" in text and "fraction-train" in text and "personalization" in text
    assert "initial-version must be latest, none or a version number" in text


def test_federate_and_simulate_submit_run_configs_of_the_typed_keys_and_defaults() -> None:
    from common.runconfig import RunConfig
    from server.cli import federate_run_config
    from server.config import ServerSettings
    from simulation.run import SimulationSettings

    simulated = RunConfig.from_mapping(SimulationSettings().run_config("sqlite://"))
    assert simulated.local_baseline and simulated.initial_version == "none"
    federate = federate_run_config(_parse("server", "federate"), ServerSettings())
    assert federate == RunConfig(database_url="").to_mapping()  # the command's defaults are the app's
    with pytest.raises(ServerConfigError, match="fraction-train"):
        federate_run_config(_parse("server", "federate", "--fraction-train", "0"), ServerSettings())
    assert federate_run_config(_parse("server", "federate", "--local-baseline"), ServerSettings())["local-baseline"]


def _parse(*argv: str):
    import argparse

    from agent.commands import add_commands as agent_commands
    from server.cli import add_commands as server_commands

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command")
    server_commands(subparsers)
    agent_commands(subparsers)
    return parser.parse_args(list(argv))


def test_an_agents_device_trains_its_own_model_on_its_own_data_under_its_budget(tmp_path) -> None:
    from agent.config import load_config
    from agent.digits import write_device_data
    from demo.devices import FakeDevice, write_config
    from schedules.schedule import Schedule

    data = write_device_data(tmp_path / "digits.npz", 1, 3)
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), data, "agent.digits:digits_workload", "16x1x8x8",
                        device_name="pi-kitchen", training_memory_budget="12MB", training_optimizer="adamw",
                        training_momentum=0.0, training_learning_rate=0.003)
    device = Device(0, node_config={"agent-config": str(path.resolve()), "device-name": "pi-kitchen"},
                    personalization="none")
    initial = device.ask("query.initial", RecordDict({"config": ConfigRecord()})).content["arrays"]
    reply = device.ask("train", weights_message(initial, **{"local-steps": 4}))
    metrics, info = reply.content["metrics"], reply.content["device"]
    assert tuple(metrics.keys()) == METRIC_KEYS  # the same keys as a simulated device's
    tolerance = load_config(path).training.memory_tolerance
    assert metrics["budget-bytes"] == 12_000_000 and 0 < metrics["peak-bytes"] <= 12_000_000 + tolerance
    assert metrics["steps"] == 4 and metrics["num-examples"] == 4 * 16
    assert str(info["device-name"]) == "pi-kitchen"
    cached = [Schedule.load(p) for p in (load_config(path).device.state_dir / "prepared").glob("*/schedule-*.json")]
    assert [s.schedule_id for s in cached] == [str(info["schedule-id"])]  # the agent's own, cached schedule
    assert cached[0].step.training.optimizer == "adamw"  # planned for the optimizer its config names
    changed = reply.content["arrays"].to_torch_state_dict()
    # ... and trained with it: four AdamW steps of plain PyTorch from the same weights on the same batches
    reference = _plain_steps(initial.to_torch_state_dict(), path, steps=4)
    for key, value in reference.items():
        assert bits_equal(changed[key], value), key


def test_the_local_only_baseline_trains_the_device_alone_with_the_steps_it_spent_in_the_run() -> None:
    import torch

    from agent.digits import device_dataset

    device = Device(1)
    initial = ArrayRecord(client.task_for(0).initial)
    trained = device.ask("train", weights_message(initial, **{"local-steps": 3})).content["arrays"]
    device.ask("train", weights_message(trained, **{"local-steps": 3}))
    reply = device.ask("train.personalize", weights_message(trained, **{"finetune-steps": 4, "local-baseline": True}))
    metrics = reply.content["metrics"]
    assert metrics["local-steps-total"] == 3 + 3 + 4  # two rounds and the fine-tuning: the same compute
    # the baseline is the device alone: the seeded initial weights, its own data from its first batch
    task = client.task_for(0)
    data = device_dataset(1, 3, seed=0)
    plan = client.device_plan(task, client.DeviceSetup.from_context(device.context), device.context)
    rng = torch.get_rng_state()
    once = task.train(task.initial, data, plan, steps=10, lr=0.05).weights
    # ... and again with the optimizer restarted where the run restarted it: each round, then the fine-tuning
    restarted, position = task.initial, (0, 0)
    for part in (3, 3, 4):
        outcome = task.train(restarted, data, plan, steps=part, lr=0.05, position=position)
        restarted, position = outcome.weights, outcome.position
    torch.set_rng_state(rng)
    selection, test = holdout_halves(data)
    chosen = {"local": task.evaluate(once, selection)[1], "local-restarted": task.evaluate(restarted, selection)[1]}
    alone = restarted if chosen["local-restarted"] > chosen["local"] else once  # the better baseline is kept
    assert metrics["local-restarted"] == int(alone is restarted)
    assert any(not bits_equal(once[k], restarted[k]) for k in once)  # two baselines, not one twice
    assert metrics["local-accuracy"] == pytest.approx(task.evaluate(alone, test)[1])
    assert metrics["select-local-accuracy"] == pytest.approx(task.evaluate(alone, selection)[1])
    # the device keeps the device alone unless another is right on two more of the selection half's samples,
    # and reports what it kept on the test half
    chosen = {c: metrics[f"select-{c}-accuracy"] for c in CANDIDATES}
    best = max(CANDIDATES, key=lambda c: (chosen[c], -metrics[f"select-{c}-loss"], -CANDIDATES.index(c)))
    switch = (chosen[best] - chosen["local"]) * len(selection.holdout_y) >= SWITCH_SAMPLES - 1e-6
    kept = kept_name(metrics["kept"])
    assert kept == (best if switch else "local")
    assert metrics["kept-accuracy"] == metrics[f"{kept}-accuracy"]
    # not asked for, not trained
    plain = device.ask("train.personalize", weights_message(trained, **{"finetune-steps": 4}))
    assert "local-accuracy" not in plain.content["metrics"]


@pytest.mark.parametrize("personalization", ["finetune", "fedbn"])
def test_an_agents_device_keeps_its_personalized_model_shows_it_and_exports_it(tmp_path, capsys,
                                                                                 personalization) -> None:
    import torch

    from agent.commands import export_model, show_status
    from agent.prepare import build_workload
    from agent.digits import write_device_data
    from agent.personal_model import folder, load
    from demo.devices import FakeDevice, write_config

    data = write_device_data(tmp_path / "digits.npz", 1, 3)
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), data, "agent.digits:digits_workload", "16x1x8x8",
                        device_name="pi-kitchen", training_memory_budget="12MB")
    device = Device(0, node_config={"agent-config": str(path.resolve()), "device-name": "pi-kitchen"},
                    personalization=personalization)
    initial = device.ask("query.initial", RecordDict({"config": ConfigRecord()})).content["arrays"]
    reply = device.ask("train.personalize", weights_message(initial, **{"finetune-steps": 5, "global-version": 7}))
    assert not reply.content.array_records  # the personalized weights stay on the device ...
    metrics = reply.content["metrics"]
    config = _parse("agent", "status", "--config", str(path))
    provenance, weights = load(load_config_of(path).device.state_dir)  # ... in its state directory
    assert (provenance.global_version, provenance.steps, provenance.run_id) == (7, 5, 1)
    assert provenance.personalization == personalization and provenance.input == "16x1x8x8"
    assert provenance.accuracy_after == pytest.approx(metrics["personal-accuracy"])
    assert provenance.accuracy_before == pytest.approx(metrics["global-accuracy"])
    assert provenance.kept == kept_name(metrics["kept"]) and provenance.accuracy_kept == metrics["kept-accuracy"]
    shared = initial.to_torch_state_dict()
    fine_tuned = any(not bits_equal(weights[k], shared[k]) for k in shared)
    assert fine_tuned == (provenance.kept == "personal")  # the kept candidate's weights, not the others'
    show_status(config)
    shown = capsys.readouterr().out
    assert "personalized  from global model v7 (run 1" in shown and str(folder(tmp_path / "state")) in shown
    # exported for inference, loaded with plain torch: the same outputs as the kept weights in the model
    out = tmp_path / "exported.pt"
    assert export_model(_parse("agent", "export", "--config", str(path), "--out", str(out))) == 0
    work = build_workload(load_config_of(path))
    work.model.load_state_dict(weights)
    work.model.eval()
    with torch.no_grad():
        assert torch.equal(torch.jit.load(str(out))(work.inputs), work.model(work.inputs))
    # a changed weights file is refused, not exported
    (folder(tmp_path / "state") / "model.pt").write_bytes(b"not a model")
    from agent.errors import PersonalModelError

    with pytest.raises(PersonalModelError, match="does not match its provenance"):
        export_model(_parse("agent", "export", "--config", str(path), "--out", str(out)))


def _keeps_the_fleets_choice_after_a_restart(node: dict, path: Path, metrics: dict, received: dict) -> None:
    """After personalize, the SuperNode restarts; the server's ``train.keep`` names another candidate than the
    device's own pick: the device keeps that one (its candidates came back from the state directory), says so,
    and lets the candidates go."""
    import torch

    from agent.federated import run_state
    from agent.personal_model import load

    own = kept_name(metrics["kept"])
    assert metrics["select-samples"] > 0 and {f"select-{c}-accuracy" for c in CANDIDATES} <= set(metrics)
    fleet = "global" if own != "global" else "personal"
    keep = RecordDict({"config": ConfigRecord({"fleet-kept": fleet})})
    # the candidates wait in files of their own, not in the run's state (the SuperNode's memory)
    state_dir = load_config_of(path).device.state_dir
    waiting = run_state.candidates_folder(state_dir, 1)
    assert sorted(p.stem for p in waiting.glob("*.pt")) == sorted(CANDIDATES)
    saved = torch.load(run_state.state_file(state_dir, 1), weights_only=True)["arrays"]
    assert saved and not [key for key in saved if key.startswith(client.CANDIDATE)]
    restarted = Device(0, node_config=node, personalization="fedper")
    kept = restarted.ask("train.keep", keep).content["metrics"]
    assert (kept_name(kept["kept"]), kept["kept-by-fleet"], kept_name(kept["own-kept"])) == (fleet, 1, own)
    assert kept["kept-accuracy"] == metrics[f"{fleet}-accuracy"]
    assert kept["global-accuracy"] == metrics["global-accuracy"]  # the personalize figures, repeated
    provenance, weights = load(load_config_of(path).device.state_dir)
    assert provenance.kept == fleet and provenance.accuracy_kept == metrics[f"{fleet}-accuracy"]
    shared = [k for k in received if not k.startswith("head.")]  # fedper: the head is the device's own
    assert all(bits_equal(weights[k], received[k]) for k in shared) == (fleet == "global")
    # the candidates are let go, in memory, in the run's file and on disk
    assert not [k for k in restarted.context.state if k.startswith(client.CANDIDATE) or k == client.CHOSEN]
    assert not waiting.exists()
    with pytest.raises(FederationError, match="has kept already"):
        Device(0, node_config=node, personalization="fedper").ask("train.keep", keep)


def load_config_of(path: Path):
    from agent.config import load_config

    return load_config(path)


def _plain_steps(weights: dict, config_path: Path, steps: int) -> dict:
    """``steps`` steps of the agent's configured optimizer in plain PyTorch on the agent's data, in data order."""
    from agent.config import load_config
    from agent.prepare import build_workload
    from agent.data import open_dataset
    from engine.training import OptimizerSettings

    config = load_config(config_path)
    work = build_workload(config)
    model = work.model
    model.load_state_dict(weights)
    settings = OptimizerSettings.from_config(config.training)
    optimizer = settings.build(model.parameters())
    data = open_dataset(config.data.path, tuple(work.inputs.shape), holdout=config.data.holdout,
                        seed=config.workload.seed)
    position = (0, 0)
    for _ in range(steps):
        inputs, targets = data.batch(*position)
        work.loss_fn(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
        position = data.position_after(*position)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _sent(dst: int) -> Message:
    """A train message as the grid sends it: the grid gives it its id (``object_id``) on the way out."""
    metadata = Metadata(run_id=1, message_id="", src_node_id=SUPERLINK_NODE_ID, dst_node_id=dst,
                        reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0, message_type="train")
    message = Message(RecordDict({"config": ConfigRecord()}), metadata=metadata)
    message.metadata.__dict__["_message_id"] = message.object_id
    return message


def test_a_device_that_left_mid_round_is_a_row_with_its_error_and_its_name(tmp_path, monkeypatch) -> None:
    import json

    from flwr.app.error import Error

    from server.federated.serverapp import reply_row

    sent = [_sent(41), _sent(42)]
    # the SuperLink answers for a node that went away: the error comes from the SuperLink (node 1)
    metadata = Metadata(run_id=1, message_id="", src_node_id=1, dst_node_id=SUPERLINK_NODE_ID,
                        reply_to_message_id=sent[1].metadata.message_id, group_id="1", created_at=time.time(),
                        ttl=3600.0, message_type="train")
    error = Message(Error(code=3, reason="the node went offline"), metadata=metadata)
    row = reply_row(error, "train", 1, 7, sent)
    assert (row.node_id, row.device_name, row.round, row.phase) == (42, "node-42", 1, "train")
    assert row.metrics == {"error": "the node went offline (code 3)"}
    flower_dir = tmp_path / "flower"
    flower_dir.mkdir()
    (flower_dir / "supernodes.json").write_text(json.dumps({"pi-2": {"node_id": 42, "public_key": "k",
                                                                      "registered_at": 0.0}}))
    monkeypatch.setenv("POET_EDGE_DATA_DIR", str(tmp_path))  # as the server's SuperLink sets it for its apps
    assert reply_row(error, "train", 1, 7, sent).device_name == "pi-2"


def test_a_personalized_model_exports_to_onnx_with_the_same_outputs(tmp_path, monkeypatch) -> None:
    import importlib.util

    import numpy as np
    import onnx
    import torch
    from onnx.reference import ReferenceEvaluator

    from agent.digits import digits_workload
    from agent.errors import PersonalModelError
    from agent.personal_model import export, keep

    work = digits_workload(0)
    keep(tmp_path, work.model.state_dict(), model="digits", input="16x1x8x8", global_version=None, run_id=1,
         personalization="finetune", steps=0, accuracy_before=0.0, accuracy_after=0.0)
    out = export(tmp_path, work.model, work.inputs, tmp_path / "m.onnx", "onnx")
    onnx.checker.check_model(onnx.load(str(out)))
    (got,) = ReferenceEvaluator(str(out)).run(None, {"input": work.inputs.numpy()})
    with torch.no_grad():
        expected = work.model.eval()(work.inputs).numpy()
    assert np.allclose(got, expected, atol=1e-4)  # another runtime: the same function, not the same bits
    # where the package is missing, the error says what to install (the environment faked, not our code)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    with pytest.raises(PersonalModelError, match="pip install onnx"):
        export(tmp_path, work.model, work.inputs, tmp_path / "m2.onnx", "onnx")


def test_the_global_model_is_the_same_bit_for_bit_whichever_device_answers_first() -> None:
    import numpy as np
    from flwr.app import Array, MetricRecord

    from server.federated.serverapp import DeviceSampler, RecordingFedAvg

    def reply(name: str, node: int, value: float) -> Message:
        metadata = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=SUPERLINK_NODE_ID,
                            reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0,
                            message_type="train")
        content = RecordDict({"arrays": ArrayRecord({"w": Array(np.full(4, value, dtype=np.float32))}),
                              "metrics": MetricRecord({"num-examples": 1}),
                              "device": ConfigRecord({"device-name": name})})
        return Message(content, metadata=metadata)

    # float32 sums of these depend on their order: 1 + 1e8 rounds the 1 away, -1e8 + 1e8 + 1 keeps it
    replies = [reply("b", 3, 1.0), reply("a", 9, 1e8), reply("c", 5, -1e8)]
    strategy = RecordingFedAvg(lambda rows: None, run_id=1, sampler=DeviceSampler(0, 1, 1.0))
    first, _ = strategy.aggregate_train(1, replies)
    again, _ = strategy.aggregate_train(1, replies[::-1])
    assert np.array_equal(first["w"].numpy(), again["w"].numpy())


@pytest.fixture
def serverapp_process(monkeypatch):
    """What Flower sets in a ServerApp's process before ``main``: the identity its messages are sent under."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", SUPERLINK_NODE_ID), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


class FleetGrid:
    """Flower's ``Grid`` as the ServerApp sees a fleet: node ids drawn at random (as the simulation engine draws
    them) and devices that answer ``query.device`` with their names."""

    def __init__(self, names: list[str], seed: int) -> None:
        import random

        ids = random.Random(seed).sample(range(1, 1 << 40), len(names))
        self.names = dict(zip(ids, names))
        self.asked = 0

    def get_node_ids(self) -> list[int]:
        return list(self.names)

    def send_and_receive(self, messages, timeout=None) -> list[Message]:
        self.asked += len(messages)
        replies = []
        for m in messages:
            assert m.metadata.message_type == "query.device"
            replies.append(Message(RecordDict({"device": ConfigRecord({
                "device-name": self.names[m.metadata.dst_node_id]})}), reply_to=m))
        return replies


def test_each_round_samples_the_same_devices_for_a_seed_whatever_node_ids_the_fleet_drew(serverapp_process) -> None:
    from server.federated.serverapp import DeviceSampler

    names = [f"dev-{i:03d}" for i in range(40)]
    picked = []
    for node_ids_seed in (1, 2):
        grid, sampler = FleetGrid(names, node_ids_seed), DeviceSampler(seed=7, min_nodes=2, wait_seconds=1.0)
        rounds = [[grid.names[n] for n in sampler.sample(grid, "train", r, 0.25, 2)] for r in (1, 2, 3)]
        assert grid.asked == 40  # each device asked its name once, not every round
        picked.append(rounds)
    assert picked[0] == picked[1]  # by name: the same devices under other node ids
    assert all(len(r) == 10 and len(set(r)) == 10 for r in picked[0])
    assert picked[0][0] != picked[0][1]  # another draw each round
    other = DeviceSampler(seed=8, min_nodes=2, wait_seconds=1.0)
    grid = FleetGrid(names, 1)
    assert [grid.names[n] for n in other.sample(grid, "train", 1, 0.25, 2)] != picked[0][0]  # and each seed
    assert len(other.sample(grid, "train", 1, 0.01, 3)) == 3  # never fewer than the minimum
    everyone = FleetGrid(names, 3)
    assert sorted(DeviceSampler(0, 2, 1.0).sample(everyone, "train", 1, 1.0, 2)) == sorted(everyone.names)
    assert everyone.asked == 0  # the whole fleet needs no names


def test_a_round_waits_for_its_minimum_of_devices_and_then_says_how_many_came() -> None:
    from server.errors import ServerError
    from server.federated.serverapp import DeviceSampler

    with pytest.raises(ServerError, match="2 devices connected, fewer than min-nodes 5"):
        DeviceSampler(0, 5, 0.5).sample(FleetGrid(["a", "b"], 0), "train", 1, 1.0, 5)


def test_biases_norms_fine_tunes_only_biases_and_norms_in_a_smaller_plan_for_the_same_budget() -> None:
    full, tuning = client.task_for(0), client.task_for(0, tuning="biases-norms")
    data = client.data_for(client.DeviceSetup.from_context(Device(0).context))
    budget = full.budget_for(0.9)
    plan = tuning.plan("rpi4", budget)
    outcome = tuning.train(full.initial, data, plan, steps=4, lr=0.05)
    changed = {k for k in full.initial if not bits_equal(outcome.weights[k], full.initial[k])}
    trainable = {k for k, p in tuning.model.named_parameters() if p.requires_grad}
    norms = {f"body.{i}.{k}" for i in (1, 4) for k in ("weight", "bias")}  # the two BatchNorms' affine parameters
    assert trainable == {k for k in full.initial if k.endswith(".bias")} | norms
    assert changed - {k for k in full.initial if "running_" in k or "num_batches" in k} == trainable
    # no gradients or optimizer state for the frozen weights: the fine-tuning plan needs less of the budget
    assert plan.schedule.predicted_peak_bytes < full.plan("rpi4", budget).schedule.predicted_peak_bytes
    devices = {s: Device(0, personalization=s) for s in ("finetune", "biases-norms")}
    replies = {s: d.ask("train.personalize", weights_message(ArrayRecord(full.initial), **{"finetune-steps": 3}))
               for s, d in devices.items()}
    planned = {s: r.content["metrics"]["planned-peak-bytes"] for s, r in replies.items()}
    assert 0 < planned["biases-norms"] < planned["finetune"]
    assert all(r.content["metrics"]["budget-bytes"] == replies["finetune"].content["metrics"]["budget-bytes"]
               for r in replies.values())  # the device's budget, whichever part it tunes


@pytest.mark.parametrize("pull", [0.0, 20.0])
def test_ditto_trains_a_personal_model_beside_the_global_one_and_never_sends_it(pull) -> None:
    device = Device(0, partitions=3, personalization="ditto", **{"ditto-lambda": pull})
    initial = ArrayRecord(client.task_for(0).initial)
    reply = device.ask("train", weights_message(initial))
    assert reply.content["metrics"]["steps"] == 2 * 3  # the global model's 3 steps and the personal model's 3
    sent = reply.content["arrays"].to_torch_state_dict()
    own = device.context.state[client.DITTO].to_torch_state_dict()
    assert list(reply.content.array_records) == ["arrays"]  # the global model's update only: below, not own
    trained = [k for k, p in client.task_for(0).model.named_parameters()]
    if pull == 0.0:  # no pull: the same start, batches and steps as the global model's training, bit for bit
        assert all(bits_equal(own[k], sent[k]) for k in trained)
    else:  # lr 0.05 x 20: every step ends on the round's global model itself
        start = initial.to_torch_state_dict()
        assert all(bits_equal(own[k], start[k]) for k in trained)
        assert any(not bits_equal(sent[k], start[k]) for k in trained)
    final = device.ask("train.personalize", weights_message(reply.content["arrays"], **{"finetune-steps": 2}))
    assert not final.content.array_records and 0 <= final.content["metrics"]["personal-accuracy"] <= 1


def test_a_device_absent_from_a_round_says_why_and_is_recorded_but_not_averaged() -> None:
    from server.federated.serverapp import DeviceSampler, RecordingFedAvg

    # device 0 of 2 keeps UTC: round 13 starts at 12:00, when a device on the night trace is unplugged
    asleep = Device(0, partitions=2, availability="night")
    initial = ArrayRecord(client.task_for(0).initial)
    reply = asleep.ask("train", weights_message(initial, **{"server-round": 13}))
    assert not reply.content.array_records and not reply.content.metric_records
    assert "not charging at 12:00 local time" in str(reply.content["device"]["absent"])
    awake = Device(1, partitions=2, availability="night").ask("train", weights_message(initial, **{"server-round": 13}))
    assert awake.content.array_records  # device 1's clock is 12 hours ahead: midnight, charging

    def delivered(msg: Message, node: int) -> Message:  # as the SuperLink hands a reply to the ServerApp
        metadata = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=SUPERLINK_NODE_ID,
                            reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0,
                            message_type="train")
        return Message(msg.content, metadata=metadata)

    rows = []
    strategy = RecordingFedAvg(rows.extend, run_id=1, sampler=DeviceSampler(0, 1, 1.0))
    averaged, _ = strategy.aggregate_train(13, [delivered(reply, 5), delivered(awake, 6)])
    alone, _ = strategy.aggregate_train(13, [delivered(awake, 6)])
    assert all(bits_equal(averaged.to_torch_state_dict()[k], v) for k, v in alone.to_torch_state_dict().items())
    recorded = {r.device_name: r.metrics for r in rows[:2]}
    assert "not charging" in recorded["small-000"]["absent"] and "accuracy" in recorded["medium-001"]
    assert strategy.aggregate_train(14, [delivered(reply, 5)]) == (None, None)  # nobody: no new model


def test_a_device_trains_under_a_run_config_with_keys_of_a_newer_server() -> None:
    device = Device(0, **{"a-key-from-a-newer-release": 1})
    reply = device.ask("train", weights_message(ArrayRecord(client.task_for(0).initial)))
    assert reply.content["metrics"]["steps"] == 3
    with pytest.raises(ServerConfigError, match="unknown key 'a-key-from-a-newer-release'"):
        federation_config(device.context.run_config)  # the server that sent it knows its own keys


def test_a_device_agent_refuses_the_simulation_only_strategies_saying_what_it_runs(tmp_path) -> None:
    from agent.digits import write_device_data
    from agent.errors import FederationError
    from demo.devices import FakeDevice, write_config

    data = write_device_data(tmp_path / "digits.npz", 0, 3)
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), data, "agent.digits:digits_workload", "16x1x8x8",
                        device_name="pi-hall", training_memory_budget="12MB")
    for name in ("ditto", "biases-norms"):
        device = Device(0, node_config={"agent-config": str(path.resolve()), "device-name": "pi-hall"},
                        personalization=name)
        with pytest.raises(FederationError, match=f"pi-hall: personalization {name} runs in simulations only"):
            device.ask("train", weights_message(ArrayRecord(client.task_for(0).initial)))


def test_ditto_on_a_device_with_no_room_for_a_second_model_says_so_and_by_how_much() -> None:
    from simulation.fleet import classes_config

    small = next(n for n in fleet_node_configs(3, DEFAULT_CLASSES) if n["device-class"] == "small")
    device = Device(0, node_config=small, personalization="ditto", **{"device-classes": classes_config(DEFAULT_CLASSES)})
    initial = ArrayRecord(client.task_for(0).initial)
    # at 0.55 of a plain step the small class has no room for the global model beside its own step; the engine
    # turns this error into the reply's, which `poet-edge simulate` shows as the strategy's failure
    with pytest.raises(FederationError) as refused:
        device.ask("train", weights_message(initial))
    reason = str(refused.value)
    assert f"{small['device-name']}: ditto holds the global model (" in reason and "none fits below" in reason
    fits = Device(0, node_config=small, personalization="finetune",
                  **{"device-classes": classes_config(DEFAULT_CLASSES)}).ask("train", weights_message(initial))
    assert fits.content["metrics"]["steps"] == 3  # the same device trains without the second model


def test_an_agents_personal_layers_and_data_position_outlive_a_supernode_restart(tmp_path) -> None:
    from agent.digits import write_device_data
    from agent.federated.run_state import state_file
    from demo.devices import FakeDevice, write_config

    data = write_device_data(tmp_path / "digits.npz", 0, 3)
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), data, "agent.digits:digits_workload", "16x1x8x8",
                        device_name="pi-hall", training_memory_budget="12MB")
    node = {"agent-config": str(path.resolve()), "device-name": "pi-hall"}
    first = Device(0, node_config=node, personalization="fedper")
    initial = first.ask("query.initial", RecordDict({"config": ConfigRecord()})).content["arrays"]
    sent = first.ask("train", weights_message(initial)).content["arrays"]
    saved = state_file(load_config_of(path).device.state_dir, 1)
    assert saved.exists()
    # the SuperNode restarts: Flower hands the device's ClientApp a fresh context for the same run
    restarted = Device(0, node_config=node, personalization="fedper")
    resumed = restarted.ask("train", weights_message(sent))
    continued = first.ask("train", weights_message(sent))  # the device that never restarted
    for key, value in continued.content["arrays"].to_torch_state_dict().items():
        assert bits_equal(resumed.content["arrays"].to_torch_state_dict()[key], value), key
    heads = [d.context.state[client.PERSONAL].to_torch_state_dict() for d in (first, restarted)]
    assert heads[0].keys() and all(bits_equal(heads[0][k], heads[1][k]) for k in heads[0])
    assert dict(restarted.context.state[client.POSITION]) == dict(first.context.state[client.POSITION])
    # its local-only baseline repeats the rounds it trained before and after the restart
    reply = restarted.ask("train.personalize", weights_message(sent, **{"finetune-steps": 4, "local-baseline": True}))
    metrics = reply.content["metrics"]
    assert metrics["local-steps-total"] == 3 + 3 + 4
    _keeps_the_fleets_choice_after_a_restart(node, path, metrics, sent.to_torch_state_dict())
    # without the file the device would have gone on from its initial head, unseen
    saved.unlink()
    forgot = Device(0, node_config=node, personalization="fedper")
    forgot.ask("train", weights_message(sent))
    head = forgot.context.state[client.PERSONAL].to_torch_state_dict()
    assert any(not bits_equal(head[k], heads[0][k]) for k in head)
    # a damaged file stops the device's part of the run, naming it, and stays for whoever looks at it
    saved.write_bytes(b"not a state file")
    with pytest.raises(FederationError, match=f"cannot read this device's state of run 1 from {saved}"):
        Device(0, node_config=node, personalization="fedper").ask("train", weights_message(sent))
    assert saved.read_bytes() == b"not a state file"


def test_a_fleet_started_from_a_vendors_pretrained_file_starts_there_and_a_wrong_file_is_refused(tmp_path) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from agent.digits import vendor_dataset
    from agent.federated.virtual import FleetData
    from server.model_files import read_weights
    from simulation.profile import profile_once
    from agent.vendor import pretrain

    data = FleetData(samples=16)
    vendor = pretrain(3, data, 0, 40, 0.05, tmp_path / "vendor.safetensors", profile_once(0))
    seeded = client.task_for(0)
    assert vendor.accuracy > seeded.evaluate(seeded.initial, vendor_dataset(3, data=data))[1]  # it learned
    stored = read_weights(vendor.path)  # what `poet-edge server versions import` reads
    assert set(stored) == set(seeded.initial)
    device = Device(0, samples=16, **{"initial-weights": str(vendor.path)})
    initial = device.ask("query.initial", RecordDict({"config": ConfigRecord()})).content["arrays"].to_torch_state_dict()
    assert all(np.array_equal(initial[k].numpy(), stored[k]) for k in stored)  # the run starts from the vendor's
    alone = client._device(device.context).task.initial  # what its local-only baseline trains from
    assert all(np.array_equal(alone[k].numpy(), stored[k]) for k in stored)  # ... the vendor's too
    other = {k: torch.zeros(3) if k == "head.bias" else v for k, v in initial.items()}
    save_file({k: v.contiguous() for k, v in other.items()}, str(tmp_path / "other.safetensors"))
    with pytest.raises(FederationError, match=r"run config initial-weights: the weights in .*other.safetensors are not "
                                              r"for this model \(shapes differ: head.bias \(3,\)"):
        Device(1, samples=16, **{"initial-weights": str(tmp_path / "other.safetensors")}).ask(
            "train", weights_message(ArrayRecord(initial)))


def test_a_text_device_trains_lora_adapters_and_sends_only_them() -> None:
    # no budget: the planner's part is the digits' tests' (and a budgeted text fleet runs in simulate); a
    # budget below a plain step needs the refined profile, 25 s more of this test
    text = {"dataset": "python-stdlib", "samples": 32, "viewpoints": 0.0, "device-classes": "c=rpi4:1"}
    device = Device(0, personalization="finetune", **text)
    initial = device.ask("query.initial", RecordDict({"config": ConfigRecord()})).content["arrays"]
    assert initial.keys() and all("lora_" in k for k in initial.keys())  # the frozen base never leaves
    reply = device.ask("train", weights_message(initial, **{"local-steps": 3}))
    sent, metrics = reply.content["arrays"].to_torch_state_dict(), reply.content["metrics"]
    assert set(sent) == set(initial.keys())
    assert any(not bits_equal(sent[k], initial.to_torch_state_dict()[k]) for k in sent)  # trained
    assert metrics["steps"] == 3 and 0 < metrics["accuracy"] < 1  # next-byte accuracy on its package's text
