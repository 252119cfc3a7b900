"""``finetune``: the global model fine-tuned locally after the rounds, whole."""

from __future__ import annotations

from agent.personalization.base import Strategy, register


@register
class Finetune(Strategy):
    """Every round trains and shares the whole model; the personalize phase fine-tunes all of it on local data."""

    name = "finetune"
