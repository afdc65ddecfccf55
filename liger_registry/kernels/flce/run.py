"""FlceRun: what one FLCE call runs (options, planned strategy and chunk, decided backend), flattened for torch.library."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass

from liger_registry.limits import OP_OPTIONS

from .options import FlceOptions

# the fields of FlceOptions the computation reads (the budget knobs and the strategy live on in the plan)
LOSS_FIELDS = OP_OPTIONS
_PLAN_FIELDS = (("strategy", str), ("chunk", int), ("backend", str), ("argmax_mode", int))


@dataclass(frozen=True)
class FlceRun:
    """One call's computation: ``strategy`` is ``"tokens"`` (``chunk`` rows per chunk) or ``"vocab"``
    (``chunk`` vocabulary columns per chunk); ``argmax_mode`` 0: none, 1: valid rows, 2: every row."""

    options: FlceOptions
    strategy: str
    chunk: int
    backend: str
    argmax_mode: int = 0

    def flat(self) -> tuple:
        """The positional arguments of the custom op (its schema has no dataclasses)."""
        o = self.options
        return (
            *(getattr(o, f) for f in LOSS_FIELDS),
            self.strategy,
            self.chunk,
            self.backend,
            self.argmax_mode,
        )

    @classmethod
    def from_flat(cls, *flat) -> FlceRun:
        """The run whose :meth:`flat` is ``flat``."""
        n = len(LOSS_FIELDS)
        options = FlceOptions(**dict(zip(LOSS_FIELDS, flat[:n], strict=True)))
        return cls(options, *flat[n:])


def _run_parameters() -> list[inspect.Parameter]:
    hints = typing.get_type_hints(FlceOptions)
    named = [(name, hints[name]) for name in LOSS_FIELDS] + list(_PLAN_FIELDS)
    return [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in named]


def takes_flat_run(fn: Callable) -> Callable:
    """``fn(leading..., *flat_run)`` with the signature torch.library reads for its schema: its leading parameters,
    then one typed parameter per field of :meth:`FlceRun.flat`."""
    signature = inspect.signature(fn, eval_str=True)
    leading = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    fn.__signature__ = signature.replace(parameters=leading + _run_parameters())
    return fn
