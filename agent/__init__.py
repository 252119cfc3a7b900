"""POET Edge agent: everything that runs on the device.

The executor (:class:`agent.executor.Executor`) runs one training step of a
real ``nn.Module`` by following a POET schedule.  Importing ``agent`` imports
neither torch nor flwr; the names below are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from agent.errors import (
    AgentError,
    ExecutorError,
    InputMismatchError,
    LedgerError,
    PageCorruptError,
    PageError,
    ScheduleRefusedError,
    SwapSpaceError,
)

# Public name -> module that defines it; imported lazily because they need torch.
_LAZY = {"Executor": "agent.executor", "StepStats": "agent.ledger", "Segments": "agent.segments"}

__all__ = [
    "AgentError", "Executor", "ExecutorError", "InputMismatchError", "LedgerError", "PageCorruptError",
    "PageError", "ScheduleRefusedError", "Segments", "StepStats", "SwapSpaceError",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agent' has no attribute {name!r}")
