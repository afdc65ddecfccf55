"""Where a lint finding points: a line of a registry YAML file, or the first line of a forward's source."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# The key a finding of each check is about when its message names no value of the file.
CHECK_KEYS = {
    "targets": ("module", "causal_lm"),
    "version": ("transformers",),
    "forward": ("forward",),
    "moe": ("head.moe", "head"),
    "deep": ("kernels", "forward", "family"),
}
_PROBLEM_AT = re.compile(r"^(?P<file>\S.*?\.ya?ml)(?::(?P<line>\d+))?: ")
_QUOTED = re.compile(r"'([^']+)'")


@dataclass
class YamlIndex:
    """The line (1-based) of each key, by dotted path, and of each scalar value's first occurrence."""

    keys: dict[str, int] = field(default_factory=dict)
    values: dict[str, int] = field(default_factory=dict)


def _walk(node: yaml.Node, prefix: str, index: YamlIndex) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = f"{prefix}{key.value}"
            index.keys.setdefault(path, key.start_mark.line + 1)
            _walk(value, path + ".", index)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _walk(item, prefix, index)
    elif isinstance(node, yaml.ScalarNode):
        index.values.setdefault(str(node.value), node.start_mark.line + 1)


def yaml_index(path: Path) -> YamlIndex:
    index = YamlIndex()
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):  # the loader reports an unreadable file; here it just has no lines
        return index
    if node is not None:
        _walk(node, "", index)
    return index


def yaml_line(path: Path, check: str, message: str) -> int | None:
    """The line of a value the message quotes ('LlamaRMSNorm'), else of the key the check is about.

    Quoted values are tried last first: messages name the family first, as context, then the culprit."""
    index = yaml_index(path)
    for name in reversed(_QUOTED.findall(message)):
        if name in index.values:
            return index.values[name]
    return next((index.keys[k] for k in CHECK_KEYS.get(check, ()) if k in index.keys), None)


def problem_location(problem: str) -> tuple[str | None, int | None]:
    """(file, line) from a loader problem written as 'FILE[:LINE]: ...'."""
    match = _PROBLEM_AT.match(problem)
    if match is None:
        return None, None
    line = match.group("line")
    return match.group("file"), int(line) if line else None


def source_location(fn: Callable) -> tuple[str | None, int | None]:
    """(file, first line) of a function's source; (None, None) for one without Python source."""
    target = inspect.unwrap(fn)
    try:
        return inspect.getsourcefile(target), inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return None, None
