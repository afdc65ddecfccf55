"""The registry's defaults file (registry/defaults.yaml), read once: the schema fields take their defaults from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEFAULTS_FILE = Path(__file__).parent.parent / "registry" / "defaults.yaml"
_DEFAULTS: dict[str, Any] = yaml.safe_load(DEFAULTS_FILE.read_text(encoding="utf-8"))


_REQUIRED = object()


def default(path: str, missing: Any = _REQUIRED) -> Any:
    """The default at a dotted path of the defaults file; a missing one is an error at import, never a None,
    unless ``missing`` is given (a knob whose default the file leaves out: max_chunk_mib)."""
    node: Any = _DEFAULTS
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            if missing is not _REQUIRED:
                return missing
            raise KeyError(f"{DEFAULTS_FILE}: no default for {path!r}")
        node = node[part]
    return node


def default_list(path: str):
    """A default_factory for a list default (each entry gets its own copy)."""
    return lambda: list(default(path))
