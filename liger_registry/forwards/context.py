"""What the applier binds into an installed forward: the resolved family and the original it replaces."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from transformers import modeling_outputs

from liger_registry.forwards.registry import get_forward
from liger_registry.kernels import FlceOptions
from liger_registry.kernels.flce.options import layered_options
from liger_registry.schemas import FamilyEntry

_FALLBACK_OUTPUT = {"causal_lm": "CausalLMOutputWithPast", "causal_lm_moe": "MoeCausalLMOutputWithPast"}


@dataclass
class ForwardContext:
    """Bound once per installed forward: the resolved entry, the original forward, and the FLCE options built
    from the resolved FLCE spec (each call replaces only what comes from the model's config and the call)."""

    entry: FamilyEntry
    original: Callable
    module: ModuleType
    signature: inspect.Signature = field(init=False)
    output_class: type = field(init=False)
    flce_options: FlceOptions | None = field(init=False)
    router_logits_from_config: bool = field(init=False)
    # base model -> whether its forward takes DEFAULT_POSITIONS (forwards.positions); None: no base forward does
    takes_default_positions: Callable[[Any], bool] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.signature = inspect.signature(self.original)
        self.output_class = self._output_class()
        self.flce_options = layered_options(self.entry.flce.model_dump()) if self.entry.flce.enabled else None
        moe = get_forward(self.entry.forward).moe
        self.router_logits_from_config = moe and reads_router_logits_from_config(self.original)

    def _output_class(self) -> type:
        annotation = self.signature.return_annotation
        # `tuple | XCausalLMOutputWithPast` (multimodal heads): the ModelOutput member of the union.
        members = (
            annotation.split("|")
            if isinstance(annotation, str)
            else typing.get_args(annotation) or [annotation]
        )
        for member in members:
            if isinstance(member, str):
                member = member.strip().rpartition(".")[2]
                member = getattr(self.module, member, None) or getattr(modeling_outputs, member, None)
            if isinstance(member, type) and hasattr(member, "__dataclass_fields__"):
                return member
        return getattr(modeling_outputs, _FALLBACK_OUTPUT.get(self.entry.forward, "CausalLMOutputWithPast"))

    def bind(self, model: Any, args: tuple, kwargs: dict) -> tuple[dict[str, Any], dict[str, Any]]:
        """Named arguments of the original, and the extra keywords it collects in **kwargs."""
        bound = self.signature.bind(model, *args, **kwargs)
        named, extra = {}, {}
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                extra.update(value)
            elif kind is not inspect.Parameter.VAR_POSITIONAL:
                named[name] = value
        named.pop(next(iter(self.signature.parameters)))
        if "return_dict" in extra:  # the original's @can_return_tuple takes it from **kwargs
            named["return_dict"] = extra.pop("return_dict")
        return named, extra

    def default(self, name: str) -> Any:
        parameter = self.signature.parameters.get(name)
        return (
            None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default
        )


def reads_router_logits_from_config(original: Callable) -> bool:
    """Whether the original MoE forward falls back to `config.output_router_logits` (its own config's or its text
    config's) when no `output_router_logits` is passed: read from its source in the installed transformers, as the
    releases differ (JetMoE's 5.17 head defaults to False, its 5.25 head reads the config). A forward whose source
    cannot be read follows the convention of transformers' MoE heads: it reads the config."""
    try:
        source = inspect.getsource(original)
    except (OSError, TypeError):
        return True
    return "config.output_router_logits" in source


def installed_signature(original: Callable) -> inspect.Signature:
    """The original's signature with a keyword-only `skip_logits` before its **kwargs.

    Trainer reads this signature to decide which dataset columns to keep, so it must stay the original's.
    """
    signature = inspect.signature(original)
    params = list(signature.parameters.values())
    skip = inspect.Parameter(
        "skip_logits", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=bool | None
    )
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    params.insert(at, skip)
    return signature.replace(parameters=params)


def bind_forward(fn: Callable, ctx: ForwardContext) -> Callable:
    """A function (usable as a method) that calls `fn(self, ctx, ...)` and shows the original's signature."""

    @functools.wraps(ctx.original)
    def forward(self, *args, skip_logits=None, **kwargs):
        return fn(self, ctx, *args, skip_logits=skip_logits, **kwargs)

    forward.__signature__ = installed_signature(ctx.original)
    forward.__wrapped__ = fn
    forward.__liger_forward__ = fn
    forward.__liger_context__ = ctx
    return forward
