"""The reference library's cross-entropy loss modules and functional names, with its arguments, over our kernels.

Each argument goes to the kernel's keyword of the same meaning (`ce_weight` -> `class_weights`).
An argument our kernel does not take is refused with a TypeError naming it, unless it has its documented
default (then there is nothing to pass); nothing is dropped silently.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from liger_registry import kernels
from liger_registry.constants import IGNORE_INDEX
from liger_registry.kernels.flce.options import OPTION_FIELDS, FlceOptions

# The class-weight keyword: torch's `weight` where the kernel takes it (cross_entropy), else `class_weights`
# (fused_linear_cross_entropy, whose `weight` is the head's).
OUR_NAMES = {"weight": ("weight", "class_weights"), "ce_weight": ("class_weights",)}


def _accepted(kernel: Callable) -> frozenset[str]:
    names = frozenset(inspect.signature(kernel).parameters)
    return names | OPTION_FIELDS if kernel is kernels.fused_linear_cross_entropy else names


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (not isinstance(value, torch.Tensor) and value == default)


def kernel_kwargs(kernel: Callable, reference: Callable, given: dict[str, Any]) -> dict[str, Any]:
    """Our kernel's keywords for the reference callable's arguments `given` (its documented defaults are read
    from `reference`'s own signature, declared once)."""
    accepted, defaults = _accepted(kernel), inspect.signature(reference).parameters
    out, refused = {}, []
    for name, value in given.items():
        ours = next((n for n in OUR_NAMES.get(name, (name,)) if n in accepted), None)
        if ours is not None:
            out[ours] = value
        elif not _is_default(value, defaults[name].default):
            refused.append(f"{name}={value!r}")
    if refused:
        raise TypeError(
            f"{reference.__qualname__}: liger_registry.kernels.{kernel.__name__} does not support "
            f"{', '.join(refused)}; leave {'them' if len(refused) > 1 else 'it'} at the default"
        )
    return out


def _validated(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords, once FlceOptions has checked the option values among them (both CE kernels share its
    checks), so a bad value is refused at construction as the reference does."""
    FlceOptions(**{k: v for k, v in kwargs.items() if k in OPTION_FIELDS})
    return kwargs


class LigerCrossEntropyLoss(nn.Module):
    """liger-kernel's `LigerCrossEntropyLoss`: `forward(_input [N, V], target [N])` on `kernels.cross_entropy`.

    The arguments are read once, at construction, into `kernel_kwargs` (the kernel's keywords)."""

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = IGNORE_INDEX,
        lse_square_scale: float = 0.0,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        softcap: float | None = None,
        return_z_loss: bool = False,
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
    ):
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        super().__init__()
        self.kernel_kwargs = _validated(
            kernel_kwargs(kernels.cross_entropy, LigerCrossEntropyLoss.__init__, given)
        )

    def forward(self, _input: torch.Tensor, target: torch.Tensor):
        return kernels.cross_entropy(_input, target, **self.kernel_kwargs)


class LigerFusedLinearCrossEntropyLoss(nn.Module):
    """liger-kernel's `LigerFusedLinearCrossEntropyLoss`: `forward(lin_weight [V, H], _input [N, H], target [N],
    bias=None)` on `kernels.fused_linear_cross_entropy` (the logits are never materialised).

    The arguments are read once, at construction, into `kernel_kwargs` (the kernel's keywords)."""

    def __init__(
        self,
        ce_weight: torch.Tensor | None = None,
        ignore_index: int = IGNORE_INDEX,
        lse_square_scale: float = 0.0,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        softcap: float | None = None,
        return_z_loss: bool = False,
        accum_dtype: torch.dtype | None = None,
        use_token_scaling: bool = False,
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
    ):
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        super().__init__()
        reference = LigerFusedLinearCrossEntropyLoss.__init__
        self.kernel_kwargs = _validated(kernel_kwargs(kernels.fused_linear_cross_entropy, reference, given))

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor, bias=None):
        return kernels.fused_linear_cross_entropy(_input, lin_weight, target, bias, **self.kernel_kwargs)


def liger_cross_entropy(
    input,
    target,
    weight=None,
    size_average=None,
    ignore_index: int = IGNORE_INDEX,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
):
    """liger-kernel's `liger_cross_entropy` on `kernels.cross_entropy`; the legacy `size_average` / `reduce`
    (placeholders there) are refused unless None: say `reduction=`."""
    given = {k: v for k, v in locals().items() if k not in ("input", "target")}
    return kernels.cross_entropy(
        input, target, **kernel_kwargs(kernels.cross_entropy, liger_cross_entropy, given)
    )


def liger_fused_linear_cross_entropy(
    input,
    weight,
    target,
    bias=None,
    ce_weight=None,
    ignore_index: int = IGNORE_INDEX,
    lse_square_scale: float = 0.0,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    return_z_loss: bool = False,
    accum_dtype=None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    chunk_mem_const: int = 1,
):
    """liger-kernel's `liger_fused_linear_cross_entropy` on `kernels.fused_linear_cross_entropy`."""
    given = {k: v for k, v in locals().items() if k not in ("input", "weight", "target", "bias")}
    kwargs = kernel_kwargs(kernels.fused_linear_cross_entropy, liger_fused_linear_cross_entropy, given)
    return kernels.fused_linear_cross_entropy(input, weight, target, bias, **kwargs)


def liger_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """liger-kernel's `liger_swiglu`: `silu(a) * b` on `kernels.swiglu`."""
    return kernels.swiglu(a, b)


def liger_geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """liger-kernel's `liger_geglu`: `gelu_tanh(a) * b` on `kernels.geglu`."""
    return kernels.geglu(a, b)


def liger_layer_norm(X: torch.Tensor, W: torch.Tensor, B: torch.Tensor | None, eps: float) -> torch.Tensor:
    """liger-kernel's `liger_layer_norm` on `kernels.layer_norm`."""
    return kernels.layer_norm(X, W, B, eps)
