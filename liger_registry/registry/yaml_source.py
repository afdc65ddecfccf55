"""Safe YAML loading within size, node and depth limits that keeps line numbers, and Pydantic errors turned into
file:line: field messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from liger_registry.registry.errors import RegistryError, suggest

M = TypeVar("M", bound=BaseModel)


# What one registry file may be: bundled family files are < 10 KiB, < 2,000 nodes, < 10 levels deep.
MAX_BYTES = 1 << 20
MAX_NODES = 100_000  # counted with every alias expanded: a billion-laughs file stops here
MAX_DEPTH = 64
SHOWN = 200  # characters of an offending value or parser message quoted in an error


def shorten(text: str, limit: int = SHOWN) -> str:
    """Error text quotes at most `limit` characters of what it was given (never a whole input)."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _read(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise RegistryError(f"{path}: {size} bytes; a registry file may have at most {MAX_BYTES}")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RegistryError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except IsADirectoryError:
        raise RegistryError(f"{path}: is a directory, not a YAML file") from None
    except FileNotFoundError:
        raise RegistryError(f"{path}: cannot be read (missing, or a dangling symlink)") from None
    except OSError as exc:
        raise RegistryError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def _shape_problems(path: Path, root: yaml.Node) -> list[str]:
    """Too many nodes (aliases expanded), too deep, or a key written twice in one mapping (each with its line).

    Iterative and bounded by MAX_NODES, so a recursive or exponential alias graph costs at most that many steps.
    """
    problems, count, stack = [], 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            return [f"{path}: more than {MAX_NODES} YAML nodes with aliases expanded (an alias bomb?)"]
        if depth > MAX_DEPTH:
            return [f"{path}:{node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"]
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is not None and name != "<<" and name in seen:
                    problems.append(
                        f"{path}:{key.start_mark.line + 1}: key {shorten(name, 60)!r} written twice in one "
                        f"mapping (first at line {seen[name]}); the first would be silently dropped"
                    )
                seen.setdefault(name, key.start_mark.line + 1)
                stack += [(key, depth + 1), (value, depth + 1)]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(child, depth + 1) for child in node.value]
    return problems


def load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """A file's data and its node tree (for line numbers), parsed once with PyYAML's safe loader, within the
    limits above; every way a file can fail is a RegistryError naming it."""
    text = _read(path)
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader already refuses control characters
        node = loader.get_single_node()
        if node is None:
            return None, None
        if problems := _shape_problems(path, node):
            raise RegistryError(f"{path}: {len(problems)} problem(s)", problems)
        return loader.construct_document(node), node
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise RegistryError(f"{path}{line}: not valid YAML: {shorten(str(exc), 2 * SHOWN)}") from None
    except RecursionError:
        raise RegistryError(f"{path}: nested deeper than the YAML parser can follow") from None
    finally:
        if loader is not None:
            loader.dispose()


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
            message = f"{message} (got {shorten(repr(err.get('input')))})"
        problems.append(f"{path}{line}: {shorten(field, 120)}: {shorten(message, 4 * SHOWN)}")
    return problems


def validate_model(path: Path, model: type[M], data: Any, node: yaml.Node | None) -> M:
    """Validate parsed YAML against a schema; every problem in it is reported at once, each with its line."""
    if not isinstance(data, dict):
        raise RegistryError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = format_errors(path, model, exc, node)
        raise RegistryError(f"{path}: {len(problems)} problem(s)", problems) from None


def load_model(path: Path, model: type[M]) -> M:
    """Parse and validate one YAML file; every problem in it is reported at once."""
    return validate_model(path, model, *load_yaml(path))
