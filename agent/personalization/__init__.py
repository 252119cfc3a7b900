"""Personalization strategies, one module each, chosen by name from a registry.

``personalization`` in the run config (:mod:`common.runconfig`) names one:

- :mod:`~agent.personalization.none`: nothing personal
- :mod:`~agent.personalization.finetune`: the global model fine-tuned locally, whole
- :mod:`~agent.personalization.fedper`: the head stays on the device
- :mod:`~agent.personalization.fedbn`: the BatchNorm layers stay on the device
- :mod:`~agent.personalization.ditto`: a personal model trained beside the global one (simulations only)
- :mod:`~agent.personalization.biases_norms`: only biases and norms fine-tuned (simulations only)

:mod:`~agent.personalization.base` holds what each answers (:class:`Strategy`) and the registry
(:func:`strategy`).  The run config keeps the names without torch, for the server; a test holds the two
lists equal.
"""

from __future__ import annotations

from agent.personalization import biases_norms, ditto, fedbn, fedper, finetune, none  # noqa: F401  (they register)
from agent.personalization.base import STRATEGIES, Strategy, strategy

__all__ = ["STRATEGIES", "Strategy", "strategy"]
