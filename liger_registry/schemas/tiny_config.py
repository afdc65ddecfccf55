"""What a family's `tiny_config` may hold: plain config fields with plain values, nothing that loads code.

`lint --deep` and the parity suite build a model from it, so a key such as `_attn_implementation` naming a Hub
repository, `auto_map` or `trust_remote_code` would make transformers fetch and run remote code. Only
lower-case field names that are not private (no leading underscore) and not one of the code-loading keys are
taken; values are None, bools, numbers, strings, and lists or mappings of them (a mapping is a nested config,
checked by the same rule).
"""

from __future__ import annotations

import re
from typing import Any

# keys that make transformers import or download code, or that name another model to load
CODE_KEYS = frozenset({"auto_map", "trust_remote_code", "name_or_path", "custom_pipelines"})
_FIELD = re.compile(r"^[a-z][a-z0-9_]*\Z")
PLAIN = (type(None), bool, int, float, str)


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str) or not _FIELD.match(key):
        return "is not a plain config field (lower-case letters, digits, underscores; no leading underscore)"
    if key in CODE_KEYS or key.endswith("implementation"):
        return "could load code (remote code, a kernel or attention implementation): not allowed"
    return None


def tiny_config_problems(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key or value of a tiny_config that is not a plain config field, with its dotted path."""
    problems = []
    for key, value in values.items():
        where = f"{prefix}{key}"
        if (why := _key_problem(key)) is not None:
            problems.append(f"{where!r} {why}")
        elif isinstance(value, dict):
            problems += tiny_config_problems(value, f"{where}.")
        elif isinstance(value, list):
            if not all(isinstance(v, PLAIN) or _plain_list(v) for v in value):
                problems.append(f"{where!r}: a list may hold only plain values (or lists of them)")
        elif not isinstance(value, PLAIN):
            problems.append(f"{where!r}: {type(value).__name__} is not a plain value")
    return problems


def _plain_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, PLAIN) for v in value)
