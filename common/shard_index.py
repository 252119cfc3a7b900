"""A sharded ``save_pretrained`` folder's index (``model.safetensors.index.json``): which files hold its weights.

Read alike by the device agent (:mod:`agent.weight_files`) and the fleet server (:mod:`server.model_files`), each
raising its own error with the message this module's :class:`ValueError` carries.
"""

from __future__ import annotations

import json
from pathlib import Path

SAFETENSORS_INDEX = "model.safetensors.index.json"


def shard_files(index_file: Path) -> list[Path]:
    """The shard files ``index_file``'s ``weight_map`` names, each once, in name order, beside it.

    Raises :class:`ValueError` for an unreadable index, one without a ``weight_map``, or a shard outside the
    index's folder.
    """
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{index_file} is not a shard index (a JSON object with a weight_map): {exc}") from exc
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and "/" not in v for v in weight_map.values()):
        raise ValueError(f"{index_file}'s weight_map must map tensor names to shard files in the same folder")
    return [index_file.parent / name for name in sorted(set(weight_map.values()))]
