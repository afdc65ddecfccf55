"""Safe YAML loading within size, node and depth limits that keeps line numbers, and Pydantic errors turned into
file:line: field messages."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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
MAX_SYNTAX_PROBLEMS = 20  # lines left out before a file is given up (each costs a parse of the file)
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


class _TooBig(Exception):
    """A file past the node or depth limit: nothing of it is constructed."""


def _shape_problems(path: Path, root: yaml.Node) -> list[str]:
    """Each key written twice in one mapping, with its line; _TooBig past MAX_NODES (aliases expanded) or
    MAX_DEPTH.

    Iterative and bounded by MAX_NODES, so a recursive or exponential alias graph costs at most that many steps.
    """
    problems, count, stack = [], 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise _TooBig(f"{path}: more than {MAX_NODES} YAML nodes with aliases expanded (an alias bomb?)")
        if depth > MAX_DEPTH:
            raise _TooBig(f"{path}:{node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is not None and name != "<<" and name in seen:
                    problems.append(
                        (
                            key.start_mark.line,
                            f"{path}:{key.start_mark.line + 1}: key {shorten(name, 60)!r} written twice in one "
                            f"mapping (first at line {seen[name]}); the first would be silently dropped",
                        )
                    )
                seen.setdefault(name, key.start_mark.line + 1)
                stack += [(key, depth + 1), (value, depth + 1)]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(child, depth + 1) for child in node.value]
    return [text for _, text in sorted(problems)]


@dataclass
class ParsedYaml:
    """What parsed of a file: its data and node tree (for line numbers), the syntax-level problems found on the
    way, and the key path of each line left out so that the rest could parse (what the schema would say of
    those keys is not said: their lines are reported as not valid YAML)."""

    data: Any
    node: yaml.Node | None
    problems: list[str] = field(default_factory=list)
    left_out: list[tuple[str, ...]] = field(default_factory=list)


_KEY = re.compile(r"[ \t]*(?:-[ \t]+)?([A-Za-z_][\w.-]*)[ \t]*:(?:[ \t]|$)")
_FLOW = "while parsing a flow"


def _blank(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _culprit(exc: yaml.YAMLError, lines: list[str]) -> int | None:
    """The 0-based line to leave out for `exc`: where the flow collection the parser gave up on was opened,
    else where it stopped (the nearest written line at or above it); None when there is none."""
    flow = (getattr(exc, "context", None) or "").startswith(_FLOW)
    problem = getattr(exc, "problem_mark", None)
    mark = (getattr(exc, "context_mark", None) if flow else None) or problem
    if mark is None:
        return None
    line = min(mark.line, len(lines) - 1)
    while line >= 0 and _blank(lines[line]):
        line -= 1
    return line if line >= 0 else None


def _key_path(lines: list[str], line: int) -> tuple[str, ...]:
    """The keys leading to a line of a block-style file, by indentation."""
    keys, indent = [], _indent(lines[line]) + 1
    for text in reversed(lines[: line + 1]):
        if _blank(text) or _indent(text) >= indent:
            continue
        indent = _indent(text)
        if key := _KEY.match(text):
            keys.append(key.group(1))
        if indent == 0:
            break
    return tuple(reversed(keys))


def _leave_out(lines: list[str], line: int) -> None:
    """Blank a line and the lines indented under it (the other lines keep their numbers)."""
    end = line + 1
    while end < len(lines) and (_blank(lines[end]) or _indent(lines[end]) > _indent(lines[line])):
        end += 1
    lines[line:end] = [""] * (end - line)


def _syntax_problem(path: Path, exc: yaml.YAMLError, line: int, keys: tuple[str, ...]) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None and mark.line != line:
        problem += f" at line {mark.line + 1}"
    if context := getattr(exc, "context", None):
        flow = context.startswith(_FLOW)
        problem += f" ({context.removeprefix('while parsing a ')} opened here)" if flow else f" ({context})"
    if "'\\t'" in problem:
        problem += "; YAML indents with spaces, never tabs"
    key = keys[0] if keys else "(top level)"
    return f"{path}:{line + 1}: {key}: not valid YAML: {shorten(problem, 2 * SHOWN)}"


def _check_depth(path: Path, text: str) -> None:
    """_TooBig past MAX_DEPTH levels, found from the parser's events: the composer recurses once per level, so a
    file nested thousands deep would otherwise end in a RecursionError wherever the stack runs out."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _TooBig(f"{path}:{event.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _compose(path: Path, text: str) -> tuple[Any, yaml.Node | None, list[str]]:
    _check_depth(path, text)
    loader = yaml.SafeLoader(text)  # its reader already refuses control characters
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None, []
        shape = _shape_problems(path, node)
        return loader.construct_document(node), node, shape
    finally:
        loader.dispose()


def parse_yaml(path: Path) -> ParsedYaml:
    """A file parsed with PyYAML's safe loader within the limits above. A line the parser stops at (a tab, a
    bad indent, an unclosed bracket, an unsafe tag) is reported and left out with the lines under it, and the
    rest is parsed again: one run reports every problem of the file. Unreadable, too big or too deep: a
    RegistryError naming the file."""
    lines = _read(path).split("\n")
    problems: list[str] = []
    left_out: list[tuple[str, ...]] = []
    while len(problems) <= MAX_SYNTAX_PROBLEMS:  # each round blanks at least one written line
        try:
            data, node, shape = _compose(path, "\n".join(lines))
        except yaml.YAMLError as exc:
            line = _culprit(exc, lines)
            if line is None:
                problems.append(_syntax_problem(path, exc, 0, ()))
                return ParsedYaml(None, None, problems, left_out)
            left_out.append(_key_path(lines, line))
            problems.append(_syntax_problem(path, exc, line, left_out[-1]))
            _leave_out(lines, line)
            continue
        except _TooBig as exc:
            raise RegistryError(str(exc)) from None
        except RecursionError:
            raise RegistryError(f"{path}: nested deeper than the YAML parser can follow") from None
        return ParsedYaml(data, node, problems + shape, left_out)
    problems.append(
        f"{path}: more than {MAX_SYNTAX_PROBLEMS} lines are not valid YAML; the rest is not checked"
    )
    raise RegistryError(f"{path}: not valid YAML", problems)


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


def _related(loc: tuple, keys: tuple[str, ...]) -> bool:
    """Whether an error at `loc` is about a left-out key: that key, one under it, or one holding it."""
    names = tuple(str(p) for p in loc if isinstance(p, str))
    if not keys:
        return False
    common = min(len(names), len(keys))
    return names[:common] == keys[:common]


def format_errors(
    path: Path,
    model: type[BaseModel],
    exc: ValidationError,
    node: yaml.Node | None,
    left_out: list[tuple[str, ...]] = (),
) -> list[str]:
    """file:line: field: message for each field in error, but those about keys left out of a file that did not
    parse. The errors of a union's members (one per member type) are one problem of the field, in plain words."""
    problems: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = _field_loc(node, tuple(err["loc"]), err["type"])
        if any(_related(loc, keys) for keys in left_out):
            continue
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
        problems.setdefault(f"{path}{line}: {shorten(field, 120)}", []).append(message)
    return [f"{where}: {shorten(_either(messages), 4 * SHOWN)}" for where, messages in problems.items()]


def _either(messages: list[str]) -> str:
    """One message from those of a union's members: 'Input should be A or B'."""
    first, *others = list(dict.fromkeys(messages))
    return " or ".join([first, *(m.removeprefix("Input should be ") for m in others)])


def _field_loc(node: yaml.Node | None, loc: tuple, kind: str) -> tuple:
    """The error location without pydantic's labels of union members (`constrained-int`, `str`): a part that is
    no key of the file there is such a label, except the last part of a missing field."""
    if node is None:
        return loc
    kept = []
    for i, key in enumerate(loc):
        if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        elif isinstance(node, yaml.MappingNode) and (child := _child(node, key)) is not None:
            node = child
        elif not (kind == "missing" and i == len(loc) - 1):
            continue
        kept.append(key)
    return tuple(kept)


def _child(node: yaml.MappingNode, key: Any) -> yaml.Node | None:
    return next((v for k, v in node.value if k.value == key), None)


def validate_model(path: Path, model: type[M], parsed: ParsedYaml) -> M:
    """Validate a parsed file against a schema: its syntax problems and its schema problems, all at once, each
    with its line."""
    problems = list(parsed.problems)
    if isinstance(parsed.data, dict):
        try:
            result = model.model_validate(parsed.data)
        except ValidationError as exc:
            problems += format_errors(path, model, exc, parsed.node, parsed.left_out)
        else:
            if not problems:
                return result
    elif not problems:
        raise RegistryError(f"{path}: expected a mapping at the top level, got {type(parsed.data).__name__}")
    raise RegistryError(f"{path}: {len(problems)} problem(s)", problems)


def load_model(path: Path, model: type[M]) -> M:
    """Parse and validate one YAML file; every problem in it is reported at once."""
    return validate_model(path, model, parse_yaml(path))
