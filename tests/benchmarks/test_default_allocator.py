"""The default-allocator yardstick: plain PyTorch timed in a process of its own, without the mmap threshold."""

import os
import subprocess
import sys

import pytest

from benchmarks.default_allocator import MMAP_VARIABLE, plain_seconds


def test_plain_is_timed_with_the_default_allocator_even_from_a_process_that_lowered_it(monkeypatch):
    monkeypatch.setenv(MMAP_VARIABLE, "65536")  # as the executor benchmark runs
    seconds = plain_seconds("vgg11_bn", (2, 3, 32, 32), threads=1, steps=2)
    assert 0 < seconds < 60


def test_the_child_refuses_to_time_with_the_threshold_lowered():
    env = dict(os.environ, **{MMAP_VARIABLE: "65536"})
    command = [sys.executable, "-m", "benchmarks.default_allocator", "--zoo", "vgg11_bn", "--shape", "2x3x32x32"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and f"run without {MMAP_VARIABLE}" in out.stderr


def test_an_unknown_model_is_a_clear_error():
    with pytest.raises(RuntimeError, match="default allocator failed"):
        plain_seconds("no-such-model", (2, 8), threads=1, steps=1)
