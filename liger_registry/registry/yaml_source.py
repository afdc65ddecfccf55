"""Safe YAML loading that keeps line numbers, and Pydantic errors turned into file:line: field messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from liger_registry.registry.errors import RegistryError, suggest

M = TypeVar("M", bound=BaseModel)


def _load(path: Path) -> tuple[Any, yaml.Node | None]:
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise RegistryError(f"{path}{line}: not valid YAML: {exc}") from exc
    return data, node


def _node_at(node: yaml.Node | None, loc: tuple) -> yaml.Node | None:
    """The deepest YAML node along a Pydantic error location."""
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == key), None)
            if child is None:
                child = next((k for k, _ in node.value if k.value == key), None)
                return child or node
            node = child
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
    return node


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that owns the last key of a location, for close-match suggestions."""
    current: Any = model
    for key in loc[:-1]:
        if isinstance(key, int):
            continue
        if (
            not (isinstance(current, type) and issubclass(current, BaseModel))
            or key not in current.model_fields
        ):
            return None
        current = _unwrap(current.model_fields[key].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    if get_origin(annotation) is None:
        return annotation
    models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if models else annotation


def format_errors(
    path: Path, model: type[BaseModel], exc: ValidationError, node: yaml.Node | None
) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        where = _node_at(node, loc)
        line = f":{where.start_mark.line + 1}" if where is not None else ""
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            owner = _model_at(model, loc)
            allowed = list(owner.model_fields) if owner else []
            owner_name = loc[-2] if len(loc) > 1 and isinstance(loc[-2], str) else None
            what = f"{owner_name} has no field {loc[-1]!r}" if owner_name else "unknown key"
            message = f"{what}{suggest(str(loc[-1]), allowed)}; allowed: {', '.join(allowed)}"
        elif err["type"] == "literal_error":
            message = f"{message} (got {err.get('input')!r})"
        problems.append(f"{path}{line}: {field}: {message}")
    return problems


def load_model(path: Path, model: type[M]) -> M:
    """Parse and validate one YAML file; every problem in it is reported at once."""
    data, node = _load(path)
    if not isinstance(data, dict):
        raise RegistryError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = format_errors(path, model, exc, node)
        raise RegistryError(f"{path}: {len(problems)} problem(s)", problems) from None
