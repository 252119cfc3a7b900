"""Shared fixtures: where the POET reference graphs live."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# CI clones the repo with shared/ beside it; a checkout may also carry shared/ inside.
_CANDIDATES = (REPO.parent / "shared" / "bench" / "poet_graphs", REPO / "shared" / "bench" / "poet_graphs")


def reference_graph_dir() -> Path:
    """The folder of POET reference graphs, or skip the test when this checkout has none."""
    for candidate in _CANDIDATES:
        if candidate.is_dir():
            return candidate
    pytest.skip("POET reference graphs (../shared/bench/poet_graphs) are not beside this checkout")


@pytest.fixture
def poet_graphs() -> Path:
    return reference_graph_dir()
