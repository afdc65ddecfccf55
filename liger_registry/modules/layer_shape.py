"""The llama-shaped decoder layer, read from a layer class's source: pre-norm attention, then residual add,
post-attention norm, MLP and residual add, with the names the class gives its parts and arguments.

A fused add + norm forward replaces such a layer's forward; it may do so only where the class's own forward is
exactly this shape, so the shape is read from the class's source (not its current ``forward``, which a patch may
have replaced) and anything else is a reason, never a guess.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

_TEMPLATE = """
residual = hidden_states
hidden_states = self._(hidden_states)
hidden_states, _ = self._(hidden_states=hidden_states)
hidden_states = residual + hidden_states
residual = hidden_states
hidden_states = self._(hidden_states)
hidden_states = self._(hidden_states)
hidden_states = residual + hidden_states
return hidden_states
"""


@dataclass(frozen=True)
class LayerShape:
    """A llama-shaped layer: its parts' attribute names and how its forward takes and passes its arguments."""

    input_norm: str
    attention: str
    post_norm: str
    mlp: str
    parameters: tuple[str, ...]  # the forward's named parameters after hidden_states
    positional: tuple[str, ...]  # those that may be given by position
    defaults: tuple[tuple[str, Any], ...]  # (parameter, default) for each one that has a default
    passed: tuple[str, ...]  # parameters the forward hands to the attention by name
    renamed: tuple[
        tuple[str, str], ...
    ]  # (old, new): keyword renames of the forward's deprecate_kwarg decorators

    def attention_kwargs(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        """What the class's forward passes to the attention for these arguments (after hidden_states)."""
        kwargs = dict(kwargs)
        for old, new in self.renamed:
            if old in kwargs:
                value = kwargs.pop(old)
                kwargs.setdefault(new, value)
        if len(args) > len(self.positional):
            raise TypeError(f"decoder layer forward takes {len(self.positional) + 1} positional arguments")
        given = dict(zip(self.positional, args, strict=False))
        if twice := sorted(given.keys() & kwargs.keys()):
            raise TypeError(f"decoder layer forward got multiple values for {', '.join(twice)}")
        values = {**dict(self.defaults), **given, **kwargs}
        if missing := [name for name in self.passed if name not in values]:
            raise TypeError(f"decoder layer forward missing argument(s) {', '.join(missing)}")
        extra = {k: v for k, v in values.items() if k not in self.parameters}
        return {**{name: values[name] for name in self.passed}, **extra}


def _forward_def(cls: type) -> tuple[type, ast.FunctionDef] | None:
    """The class (of cls's MRO) whose source defines forward, and that definition."""
    for klass in cls.__mro__:
        if klass is object or "forward" not in vars(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            return None
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        defs = [s for s in body if isinstance(s, ast.FunctionDef) and s.name == "forward"]
        return (klass, defs[-1]) if defs else None
    return None


def _renames(fn: ast.FunctionDef) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The deprecate_kwarg renames of the forward's decorators, or a reason it has another decorator."""
    renames = []
    for decorator in fn.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        name = getattr(getattr(call, "func", None), "id", None) or getattr(
            getattr(call, "func", None), "attr", ""
        )
        if name != "deprecate_kwarg":
            return (), f"its forward has the decorator {ast.unparse(decorator)}"
        keywords = {k.arg: k.value for k in call.keywords}
        old = call.args[0] if call.args else keywords.get("old_name")
        new = keywords.get("new_name", call.args[2] if len(call.args) > 2 else None)
        if isinstance(old, ast.Constant) and isinstance(new, ast.Constant) and new.value is not None:
            renames.append((old.value, new.value))
    return tuple(renames), None


class _Names(ast.NodeTransformer):
    """Replaces each ``self.<part>`` by ``self._`` (recording the parts in order) and takes the attention
    call's keywords other than hidden_states out (recording them), so the body compares with the template."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.keywords: list[ast.keyword] = []

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            self.parts.append(node.attr)
            return ast.Attribute(value=node.value, attr="_", ctx=node.ctx)
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if any(k.arg == "hidden_states" for k in node.keywords):
            self.keywords += [k for k in node.keywords if k.arg != "hidden_states"]
            node.keywords = [k for k in node.keywords if k.arg == "hidden_states"]
        return node


def _dump(statements: list[ast.stmt]) -> str:
    return ast.dump(ast.Module(body=statements, type_ignores=[]))


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The statements, less a docstring."""
    first = fn.body[0] if fn.body else None
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return fn.body[1:] if docstring else fn.body


def _parameters(fn: ast.FunctionDef) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...], str | None]:
    """(positional parameters after hidden_states, defaults, problem) of the forward."""
    args = fn.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    if positional[:2] != ["self", "hidden_states"]:
        return (), (), "its forward does not take (self, hidden_states, ...)"
    if args.vararg is not None or args.kwarg is None:
        return (), (), "its forward does not take (..., **kwargs) without *args"
    defaulted = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
    defaulted += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
    defaults = []
    for name, node in defaulted:
        try:
            defaults.append((name, ast.literal_eval(node)))
        except ValueError:
            return (), (), f"the default of its forward's {name} is not a literal ({ast.unparse(node)})"
    return tuple(positional[2:]), tuple(defaults), None


def _attention_problem(keywords: list[ast.keyword], fn: ast.FunctionDef) -> str | None:
    """The attention must get each argument it is given by its own name, and **kwargs, and nothing else."""
    names = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    for keyword in keywords:
        value = keyword.value
        if keyword.arg is None:
            if not (isinstance(value, ast.Name) and value.id == fn.args.kwarg.arg):
                return f"its attention gets **{ast.unparse(value)}, not the forward's **{fn.args.kwarg.arg}"
        elif not (isinstance(value, ast.Name) and value.id == keyword.arg and keyword.arg in names):
            return (
                f"its attention gets {keyword.arg}={ast.unparse(value)}, not the forward's own {keyword.arg}"
            )
    if not any(k.arg is None for k in keywords):
        return "its attention does not get the forward's **kwargs"
    return None


# A memo (a class's source does not change while it is loaded), a plain dict so that a compiled forward reads it
# without tracing into the parser.
_SHAPES: dict[type, LayerShape | str] = {}


def layer_shape(cls: type) -> LayerShape | str:
    """The shape of a decoder layer class, or the reason it is not llama-shaped."""
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = _read_shape(cls)
    return shape


def planned_shape(cls: type) -> LayerShape:
    """The shape the plan found for cls or the nearest class above it: a wrapper's dynamic subclass (FSDP2's
    ``FSDP<Layer>``) runs the forward planned for the layer class it derives from."""
    for klass in cls.__mro__:
        if isinstance(shape := _SHAPES.get(klass), LayerShape):
            return shape
    shape = layer_shape(cls)
    if not isinstance(shape, LayerShape):
        raise TypeError(shape)
    return shape


def _read_shape(cls: type) -> LayerShape | str:
    found = _forward_def(cls)
    if found is None:
        return f"{cls.__name__}: the source of its forward cannot be read"
    klass, fn = found
    where = f"{cls.__name__}" + ("" if klass is cls else f" (forward of {klass.__name__})")
    renamed, problem = _renames(fn)
    if problem is None:
        positional, defaults, problem = _parameters(fn)
    if problem is not None:
        return f"{where}: {problem}"
    names = _Names()
    body = [names.visit(s) for s in _body(fn)]
    template = _Names()
    expected = [template.visit(s) for s in ast.parse(_TEMPLATE).body]
    if _dump(body) != _dump(expected) or len(names.parts) != 4:
        return (
            f"{where}: its forward is not the llama-shaped residual + attention, residual + norm, MLP, "
            "residual sequence"
        )
    if problem := _attention_problem(names.keywords, fn):
        return f"{where}: {problem}"
    input_norm, attention, post_norm, mlp = names.parts
    passed = tuple(k.arg for k in names.keywords if k.arg is not None)
    parameters = positional + tuple(a.arg for a in fn.args.kwonlyargs)
    return LayerShape(
        input_norm, attention, post_norm, mlp, parameters, positional, defaults, passed, renamed
    )


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.C`` as ["a", "b", "C"]; None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)) is not None:
        return [*head, node.attr]
    return None


def _assigned_class(tree: ast.AST, part: str, module: Any) -> type | None:
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)):
            continue
        target = node.targets[0]
        if _dotted(target) != ["self", part] or (path := _dotted(node.value.func)) is None:
            continue
        found: Any = module
        for name in path:
            found = getattr(found, name, None)
        return found if isinstance(found, type) else None
    return None


def part_class(cls: type, part: str) -> type | None:
    """The class the layer's __init__ builds ``self.<part>`` from (``self.<part> = SomeClass(...)``), when its
    source says so plainly; None otherwise."""
    for klass in cls.__mro__:
        if klass is object or "__init__" not in vars(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            return None
        return _assigned_class(tree, part, inspect.getmodule(klass))
    return None
