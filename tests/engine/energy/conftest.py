"""Fixtures for the energy meter tests; the fakes themselves live in ``fakes.py``."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.energy.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A temporary folder that other users can traverse (pytest's tmp_path is private to its owner)."""
    folder = Path(tempfile.mkdtemp(prefix="poet-energy-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
