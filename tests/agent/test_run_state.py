"""A device agent's run state on disk (agent.federated.run_state): restored whole, refused for another model."""

from __future__ import annotations

import os

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from agent.errors import FederationError
from agent.federated import run_state


def context(run_id: int) -> Context:
    return Context(run_id=run_id, node_id=7, state=RecordDict(), run_config={}, node_config={})


def test_a_fresh_context_gets_back_every_record_and_another_models_layers_are_refused(tmp_path) -> None:
    model = {"head.weight": torch.randn(10, 4), "body.weight": torch.randn(4, 4)}
    kept = context(5)
    kept.state["personal"] = ArrayRecord({"head.weight": model["head.weight"] * 2})
    kept.state["position"] = ConfigRecord({"epoch": 1, "index": 3, "rounds": [3, 3]})
    run_state.persist(kept, tmp_path)
    fresh = context(5)
    assert run_state.restore(fresh, tmp_path, model)
    assert torch.equal(fresh.state["personal"].to_torch_state_dict()["head.weight"], model["head.weight"] * 2)
    assert dict(fresh.state["position"]) == {"epoch": 1, "index": 3, "rounds": [3, 3]}
    assert not run_state.restore(context(6), tmp_path, model)  # another run: nothing of this one
    # the agent's model changed under the run: its layers are refused, naming the layer and the file
    with pytest.raises(FederationError, match="head.weight .*for another model .*move the file away"):
        run_state.restore(context(5), tmp_path, {"head.weight": torch.randn(12, 4)})
    assert run_state.state_file(tmp_path, 5).exists()


def test_only_the_newest_runs_files_are_kept(tmp_path) -> None:
    for run_id in range(run_state.KEEP_RUNS + 2):
        written = run_state.persist(context(run_id), tmp_path)
        os.utime(written, (1000 + run_id, 1000 + run_id))  # written in order, a second apart
    kept = sorted(int(p.stem) for p in run_state.state_file(tmp_path, 0).parent.glob("*.pt"))
    assert kept == list(range(2, run_state.KEEP_RUNS + 2))


def test_candidates_wait_in_files_of_their_own_and_a_missing_or_foreign_one_is_refused(tmp_path) -> None:
    model = {"head.weight": torch.randn(10, 4), "body.weight": torch.randn(4, 4)}
    run_state.write_candidates(tmp_path, 3, {"global": model, "personal": {k: v * 2 for k, v in model.items()}})
    personal = run_state.read_candidate(tmp_path, 3, "personal", model)
    assert all(torch.equal(personal[k], model[k] * 2) for k in model)
    with pytest.raises(FederationError, match="the local candidate of run 3 is not at .*local.pt"):
        run_state.read_candidate(tmp_path, 3, "local", model)
    with pytest.raises(FederationError, match="head.weight .*for another model"):
        run_state.read_candidate(tmp_path, 3, "global", {"head.weight": torch.randn(12, 4)})
    (run_state.candidates_folder(tmp_path, 3) / "global.pt").write_bytes(b"torn")
    with pytest.raises(FederationError, match="cannot read the global candidate of run 3"):
        run_state.read_candidate(tmp_path, 3, "global", model)
    # a run personalizing beside this one keeps this one's candidates; once KEEP_RUNS newer runs have
    # personalized, this one's, whose fleet never chose, go
    later = range(4, 4 + run_state.KEEP_RUNS)
    for run in later:
        os.utime(run_state.candidates_folder(tmp_path, run - 1), (run, run))  # each run older than the next
        run_state.write_candidates(tmp_path, run, {"global": model})
        assert run_state.candidates_folder(tmp_path, 3).exists() == (run < later[-1]), run
    assert all(run_state.candidates_folder(tmp_path, run).exists() for run in later)
    run_state.remove_candidates(tmp_path, 4)
    assert not run_state.candidates_folder(tmp_path, 4).exists()
