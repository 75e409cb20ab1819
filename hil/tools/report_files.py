"""Reading the JSON files the tools write and read back (conformance reports, results of earlier runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when the file is missing, unreadable, not JSON or not an object (a run
    that died before writing its report)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
