"""Shared fixtures: where the POET reference graphs live."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import reference_graph_dir as _graph_dir


def reference_graph_dir() -> Path:
    """The folder of POET reference graphs, or skip the test when this checkout has none."""
    found = _graph_dir()
    if found is None:
        pytest.skip("POET reference graphs (../shared/bench/poet_graphs, or $POET_GRAPHS) are not beside this checkout")
    return found


@pytest.fixture
def poet_graphs() -> Path:
    return reference_graph_dir()
