"""The subclass rule: an instance apply never silently replaces a method that a user's subclass overrides.

The YAML names exact classes. An instance of a subclass that *inherits* the named class's method (it did not
override it) is patched like the class itself: the replaced method is the one it would have run. A subclass
that defines its own method (``class MyLlama(LlamaForCausalLM)`` whose ``forward`` adds a regulariser, a custom
norm subclass) is refused: patching the instance would drop that override without a word. With
``strict=False`` the refusal is a warning and those modules keep their own method. A class-wide apply
(``apply("llama")``) never touches subclasses: it replaces the method on the named class, so a subclass's
override still runs and its ``super().forward(...)`` reaches the patched one.
"""

from __future__ import annotations

from typing import Any


def subclass_problem(actual: type, named: type, method: str) -> str | None:
    """Why an instance of `actual` (an instance of `named`) must not have `method` replaced, or None."""
    if getattr(actual, method, None) is getattr(named, method, None):
        return None
    owner = next((c for c in actual.__mro__ if method in vars(c)), actual)
    return (
        f"{actual.__qualname__} ({actual.__module__}) subclasses {named.__qualname__} and overrides {method} "
        f"(in {owner.__qualname__}); patching it would silently drop that override, so it is refused. Patch the "
        f"class instead (apply(<model_type>) keeps your override, whose super().{method}() then runs the kernel)"
    )


def overriding_modules(
    matched: list[tuple[str, Any]], classes: tuple[type, ...], method: str
) -> dict[str, str]:
    """{module name: problem} for the matched modules whose class overrides `method` of every target class."""
    problems = {}
    for name, module in matched:
        named = [c for c in classes if isinstance(module, c)]
        reasons = [subclass_problem(type(module), c, method) for c in named]
        if all(reasons):
            problems[name] = f"{name or '(root)'}: {reasons[0]}"
    return problems
