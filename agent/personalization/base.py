"""What every personalization strategy answers, and the registry that names them.

A strategy says what a device keeps or trains for itself after (and during) the rounds:
which state-dict entries never leave the device (:meth:`Strategy.personal_keys`),
whether its fine-tuning trains only part of the model (:attr:`Strategy.partial_tuning`,
then :meth:`Strategy.freeze`), and whether a whole personal model trains beside the
global one each round (:attr:`Strategy.trains_beside`).  Each strategy is a module of
this package that registers its class with :func:`register`; :func:`strategy` looks one
up by the name the run config gives (``personalization``).
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

import torch.nn as nn

from agent.errors import FederationError


class Strategy:
    """A personalization strategy; the defaults are those of plain fine-tuning of the whole model."""

    name: ClassVar[str]
    simulation_only: ClassVar[bool] = False
    """A simulated device runs it; a device agent refuses it (it plans for its own measured profile)."""
    partial_tuning: ClassVar[bool] = False
    """Its fine-tuning trains part of the model: it plans from a graph with the rest frozen (:meth:`freeze`)."""
    trains_beside: ClassVar[bool] = False
    """A whole personal model trains beside the global one each round, held in memory beside every step."""

    def personal_keys(self, model: nn.Module) -> frozenset[str]:
        """State-dict keys of ``model`` that never leave the device (none unless the strategy keeps layers)."""
        return frozenset()

    def freeze(self, model: nn.Module) -> nn.Module:
        """``model`` with ``requires_grad=False`` on what the strategy does not fine-tune; only where
        :attr:`partial_tuning`."""
        raise FederationError(f"{self.name!r} fine-tunes the whole model; partial tuning: "
                              f"{', '.join(n for n, s in STRATEGIES.items() if s.partial_tuning)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


STRATEGIES: dict[str, type[Strategy]] = {}
"""Every strategy by its run-config name, in the order the modules register them."""

S = TypeVar("S", bound=type[Strategy])


def register(cls: S) -> S:
    """Class decorator: ``cls`` is chosen by ``personalization = cls.name``."""
    if cls.name in STRATEGIES:
        raise ValueError(f"personalization strategy {cls.name!r} is registered twice")
    STRATEGIES[cls.name] = cls
    return cls


def strategy(name: str) -> Strategy:
    """The strategy the run config names; an unknown name is a clear error listing the known ones."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise FederationError(f"personalization {name!r} unknown; use one of {', '.join(STRATEGIES)}") from None
