"""``none``: no personalization; each device ends with the global model."""

from __future__ import annotations

from agent.personalization.base import Strategy, register


@register
class NoPersonalization(Strategy):
    """Nothing kept, nothing fine-tuned: the server skips the personalize phase."""

    name = "none"
