"""Checkpoints: atomic on a real disk, checked on load, the last two kept, a damaged newest passed over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from agent.daemon.checkpoint import CheckpointStore
from agent.daemon.checkpoint_file import MAGIC
from agent.errors import CheckpointError


def state(step: int, size: int = 1000) -> dict:
    return {"model": {"w": torch.full((size,), float(step))}, "steps_done": step}


def test_the_last_two_are_kept_and_the_newest_loads(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for step in (5, 10, 15):
        store.save(step, state(step))
    assert [p.name for p in store.paths()] == ["step-000000010.ckpt", "step-000000015.ckpt"]
    loaded = store.load_latest()
    assert loaded.steps_done == 15 and torch.equal(loaded.state["model"]["w"].load(), state(15)["model"]["w"])
    assert not loaded.skipped


def test_a_damaged_newest_falls_back_to_the_one_before(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, state(1))
    newest = store.save(2, state(2))
    data = bytearray(newest.read_bytes())
    data[len(MAGIC) + 32 + 100] ^= 0xFF  # one bit flip in the body
    newest.write_bytes(bytes(data))
    loaded = store.load_latest()
    assert loaded.steps_done == 1
    assert "checksum" in loaded.skipped[0]


def test_after_falling_back_the_good_checkpoint_is_kept_and_the_damaged_one_set_aside(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, state(1))
    newest = store.save(2, state(2))
    newest.write_bytes(newest.read_bytes()[:-10])  # a write the disk did not finish
    assert store.load_latest().steps_done == 1
    store.save(3, state(3))  # training went on from step 1
    assert [p.name for p in store.paths()] == ["step-000000001.ckpt", "step-000000003.ckpt"]
    assert (tmp_path / "step-000000002.ckpt.damaged").is_file()  # kept for a look, out of retention's way
    store.paths()[-1].write_bytes(b"garbage")
    assert store.load_latest().steps_done == 1  # the good one survived to be fallen back on again


def test_every_checkpoint_damaged_is_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, state(1)).write_bytes(b"garbage")
    path = store.save(2, state(2))
    path.write_bytes(path.read_bytes()[:50])  # truncated
    with pytest.raises(CheckpointError, match="no checkpoint can be read.*move them aside"):
        store.load_latest()


def test_no_checkpoint_yet_is_none(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "nothing").load_latest() is None


def test_a_write_the_disk_refuses_keeps_the_previous_checkpoints(tmp_path: Path) -> None:
    """A file-size limit makes the kernel refuse the write (EFBIG) as a full disk would refuse it (ENOSPC)."""
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch
        from agent.daemon.checkpoint import CheckpointStore
        from agent.errors import CheckpointError
        store = CheckpointStore({str(tmp_path)!r})
        store.save(1, {{"w": torch.zeros(10)}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            store.save(2, {{"w": torch.zeros(100_000)}})
        except CheckpointError as exc:
            print("refused:", exc)
            sys.exit(0)
        sys.exit(1)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "cannot write checkpoint" in run.stdout and "previous checkpoints are kept" in run.stdout
    store = CheckpointStore(tmp_path)
    assert [p.name for p in store.paths()] == ["step-000000001.ckpt"]
    assert not list(tmp_path.glob(".*.tmp"))  # the half-written file is gone
    assert store.load_latest().steps_done == 1


def test_kill9_during_checkpoint_writes_never_leaves_a_damaged_checkpoint(tmp_path: Path) -> None:
    """A process writing checkpoints of 8 MB as fast as it can, killed at several moments: whatever is on disk
    after each kill loads, and holds the state of the step its name says."""
    script = textwrap.dedent(f"""
        import torch
        from agent.daemon.checkpoint import CheckpointStore
        store = CheckpointStore({str(tmp_path)!r})
        step = len(store.paths()) and store.load_latest().steps_done
        while True:
            step += 1
            store.save(step, {{"w": torch.full((2_000_000,), float(step)), "steps_done": step}})
            print(step, flush=True)
    """)
    for delay in (0.01, 0.07, 0.13, 0.29):
        writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        writer.stdout.readline()  # it has written one: from here on it is always writing the next
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        store = CheckpointStore(tmp_path)
        loaded = store.load_latest()
        assert loaded is not None and not loaded.skipped
        assert loaded.state["steps_done"] == loaded.steps_done
        assert torch.equal(loaded.state["w"].load(), torch.full((2_000_000,), float(loaded.steps_done)))
        store.remove_temporaries()
        assert not list(tmp_path.glob(".*.tmp"))


class _Chunks:
    """A tensor that exists only as chunks (optimizer state on flash): what a checkpoint streams."""

    def __init__(self, whole: torch.Tensor, width: int, columns: bool) -> None:
        self.whole, self.width, self.columns = whole, width, columns
        self.dtype, self.shape = whole.dtype, tuple(whole.shape)
        self.handed = 0

    def chunks(self):
        total = self.shape[1] if self.columns else self.whole.numel()
        for start in range(0, total, self.width):
            end = min(start + self.width, total)
            part = self.whole[:, start:end] if self.columns else self.whole.view(-1)[start:end]
            self.handed += 1
            yield (start, end), part.contiguous() if self.columns else part.clone()  # a chunk of its own, as read


@pytest.mark.parametrize("columns", [False, True])
def test_chunked_sources_are_written_in_place_and_read_back_in_parts(tmp_path: Path, columns: bool) -> None:
    whole = torch.arange(7 * 50, dtype=torch.float32).reshape(7, 50)
    source = _Chunks(whole, 8, columns)
    store = CheckpointStore(tmp_path)
    store.save(3, {"optimizer": {"state": {0: {"exp_avg": source, "step": torch.tensor(3.0)}}}, "n": [1, "a"]})
    assert source.handed == (7 if columns else 44)
    loaded = store.load_latest().state
    stored = loaded["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(stored.load(), whole) and loaded["n"] == [1, "a"]
    assert torch.equal(stored.read_range(9, 30), whole.view(-1)[9:30])
    assert torch.equal(stored.read_columns(5, 21), whole[:, 5:21])
    target = torch.empty(7, 50)
    stored.load_into(target)
    assert torch.equal(target, whole)
    assert loaded["optimizer"]["state"][0]["step"].load().item() == 3.0


def test_a_checkpoint_of_the_first_format_still_loads(tmp_path: Path) -> None:
    import hashlib
    import io

    body = io.BytesIO()
    torch.save({"w": torch.ones(4), "steps_done": 7}, body)
    (tmp_path / "step-000000007.ckpt").write_bytes(b"POETCKPT1\n" + hashlib.sha256(body.getvalue()).digest()
                                                   + body.getvalue())
    loaded = CheckpointStore(tmp_path).load_latest()
    assert loaded.steps_done == 7 and torch.equal(loaded.state["w"], torch.ones(4))


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS needs Linux /proc")
def test_a_checkpoint_is_written_without_a_second_copy_of_the_state(tmp_path: Path) -> None:
    from engine import rss

    rss.return_freed_memory()
    weights = torch.ones(25_000_000)  # 100 MB of model
    state = {"model": {"w": weights}, "optimizer": {"state": {0: {"momentum_buffer": _Chunks(weights.view(5000, 5000),
                                                                                           250, True)}}}}
    before = rss.start_window()
    CheckpointStore(tmp_path).save(1, state)
    grew = rss.peak_since_start() - before
    # a 5 MB chunk at a time and the writer's buffers; a copy of either half would be 100 MB
    assert grew < 50_000_000, f"writing 200 MB of state took {grew:,} B more memory"
    loaded = CheckpointStore(tmp_path).load_latest().state
    target = torch.zeros(25_000_000)
    loaded["model"]["w"].load_into(target)
    assert torch.equal(target, weights)
