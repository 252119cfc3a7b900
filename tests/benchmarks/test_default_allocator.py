"""The default-allocator yardstick: plain PyTorch timed in a process of its own, without the mmap threshold."""

import os
import subprocess
import sys

import pytest

from benchmarks.default_allocator import MMAP_VARIABLE, plain_step


def test_plain_is_timed_with_the_default_allocator_even_from_a_process_that_lowered_it(monkeypatch):
    monkeypatch.setenv(MMAP_VARIABLE, "65536")  # as the executor benchmark runs
    step = plain_step("vgg11_bn", (2, 3, 32, 32), threads=1, steps=2)
    assert 0 < step.seconds < 60


@pytest.mark.slow  # two GPT-2 steps in processes of their own (about 20 s), out of the default run to keep it short;
# the test above checks the yardstick's allocator there
def test_the_memory_plain_holds_with_the_default_allocator_grows_with_the_batch():
    small = plain_step("gpt2", (2, 32), threads=1, steps=2)
    large = plain_step("gpt2", (8, 128), threads=1, steps=2)
    if small.growth_bytes is None:
        pytest.skip("no /proc peak RSS here")
    # the window opens above the model and its gradients: what is in it is the step's, and 16 times the tokens
    # hold far more activations
    assert 0 < small.growth_bytes < large.growth_bytes - 20e6, (small, large)


def test_the_child_refuses_to_time_with_the_threshold_lowered():
    env = dict(os.environ, **{MMAP_VARIABLE: "65536"})
    command = [sys.executable, "-m", "benchmarks.default_allocator", "--zoo", "vgg11_bn", "--shape", "2x3x32x32"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and f"run without {MMAP_VARIABLE}" in out.stderr


def test_an_unknown_model_is_a_clear_error():
    with pytest.raises(RuntimeError, match="default allocator failed"):
        plain_step("no-such-model", (2, 8), threads=1, steps=1)
