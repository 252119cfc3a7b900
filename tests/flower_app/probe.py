"""A probe app for the deployment test: each train message sleeps, marks that it started, adds 1 to the weights.

The ServerApp runs FedAvg and writes, per round, how many replies were results and how many errors (a SuperNode
stopped mid-round answers with an error), so the test can see a round complete without a departed device.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

client = ClientApp()
server = ServerApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    out = Path(str(context.run_config["out-dir"]))
    device = str(context.node_config.get("device-name", "unknown"))
    round_ = int(msg.content["config"]["server-round"])
    (out / f"{device}.round{round_}.started").write_text(str(context.node_id))
    time.sleep(float(context.run_config["train-seconds"]))
    weights = [a + 1.0 for a in msg.content["arrays"].to_numpy_ndarrays()]
    return Message(RecordDict({"arrays": ArrayRecord(weights), "metrics": MetricRecord({"num-examples": 1}),
                               "info": ConfigRecord({"device": device})}), reply_to=msg)


class CountingFedAvg(FedAvg):
    """FedAvg that keeps, per round, the results and errors it was handed."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rounds: dict[int, dict[str, list]] = {}

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        ok = [m for m in replies if not m.has_error()]
        self.rounds[server_round] = {"devices": sorted(str(m.content["info"]["device"]) for m in ok),
                                     "errors": [m.error.reason for m in replies if m.has_error()]}
        return super().aggregate_train(server_round, replies)


@server.main()
def main(grid: Grid, context: Context) -> None:
    out = Path(str(context.run_config["out-dir"]))
    strategy = CountingFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(3)]),
                            num_rounds=int(context.run_config["num-server-rounds"]), timeout=120)
    final = result.arrays.to_numpy_ndarrays()[0].tolist()
    (out / "server.json").write_text(json.dumps({"rounds": strategy.rounds, "final": final}))
