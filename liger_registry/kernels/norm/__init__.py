"""Norm kernels: the public RMSNorm, LayerNorm, fused residual add + RMSNorm and LayerNorm1P.

* Each function validates its arguments (clear ``ValueError``), then runs the backend its registered Op
  (``op``) decides for the call.
* Outputs are contiguous, in the dtype the casting mode gives; gradients flow to x (and residual), weight, bias.
"""

from __future__ import annotations

import torch

from .op import ADD_RMS_NORM, LAYER_NORM, RMS_NORM
from .reference import check_casting_mode

ADD_RMS_MODES = ("llama", "gemma")


def _check_norm_weight(what: str, weight: torch.Tensor | None, x: torch.Tensor, name: str = "weight") -> None:
    """A [hidden] weight (or bias), or None: no elementwise affine."""
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor) or weight.shape != (x.shape[-1],):
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"{what}: {name} must be a [{x.shape[-1]}] tensor or None, got {got}")


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
    *,
    in_place_backward: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dim; casting modes ``llama`` | ``gemma`` | ``none`` (see
    :func:`reference.rms_norm_torch` for what each means and why it exists). ``weight=None``: no elementwise
    affine (``nn.RMSNorm(elementwise_affine=False)``), ``y = x / rms(x)`` in the casting mode's dtypes, the
    output in x's dtype; ``offset`` does not apply and there is no weight gradient.

    ``in_place_backward=True`` lets the Triton backward overwrite the incoming gradient with dx (saves one
    activation-sized buffer). Off by default: it is only safe when nothing else reads that gradient tensor,
    and autograd may hand the same tensor to several consumers (e.g. both inputs of an ``add``)."""
    check_casting_mode(casting_mode)
    _check_norm_weight("rms_norm", weight, x)
    backend, _ = RMS_NORM.decide(x, weight, eps, offset, casting_mode)
    if backend == "triton":
        return RMS_NORM.triton_impl(x, weight, eps, offset, casting_mode, in_place_backward)
    return RMS_NORM.torch_impl(x, weight, eps, offset, casting_mode)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dim (``F.layer_norm``). ``weight=None``: no scale (with no bias too, a
    parameter-free LayerNorm such as ``OlmoLayerNorm``); ``bias=None``: no shift."""
    _check_norm_weight("layer_norm", weight, x)
    _check_norm_weight("layer_norm", bias, x, "bias")
    if weight is None and bias is not None:
        raise ValueError("layer_norm: a bias without a weight is not supported; pass a weight of ones")
    return LAYER_NORM(x, weight, bias, eps)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + x, rmsnorm(residual + x))`` in one kernel, forward and backward, with the norm's weight,
    epsilon, offset and casting mode: a decoder layer's ``hidden = residual + hidden`` and the next norm, the sum
    written once and read once. Casting modes as :func:`rms_norm`: ``llama`` (``LlamaRMSNorm``) and ``gemma``
    (``Gemma3RMSNorm`` with ``offset=1``); ``weight=None`` as :func:`rms_norm`."""
    if casting_mode not in ADD_RMS_MODES:
        raise ValueError(
            f"add_rms_norm: casting_mode={casting_mode!r}; expected one of {', '.join(ADD_RMS_MODES)}"
        )
    if x.shape != residual.shape:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    _check_norm_weight("add_rms_norm", weight, x)
    return ADD_RMS_NORM(x, residual, weight, eps, offset, casting_mode)


def layer_norm_1p(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """nemotron's ``NemotronLayerNorm1P``: ``layer_norm(x, weight + 1, bias, eps)`` on the LayerNorm op.

    ``weight + 1`` is formed in the weight's dtype, exactly as nemotron does (an offset added in fp32 inside the
    kernel would differ from it in the last bit for bf16 weights); it is one [hidden] add, and autograd carries
    the weight's gradient through it. Under autocast the inputs are cast as nemotron casts them, then the norm
    runs with autocast off."""
    device_type = x.device.type
    w1 = weight + 1.0
    if not torch.is_autocast_enabled(device_type):
        return layer_norm(x, w1, bias, eps)
    if torch.is_autocast_enabled():  # nemotron tests the CUDA flag, then casts to the device's autocast dtype
        dtype = torch.get_autocast_dtype(device_type)
        x, w1, bias = (t.to(dtype) if t is not None else None for t in (x, w1, bias))
    with torch.autocast(device_type=device_type, enabled=False):
        return layer_norm(x, w1, bias, eps)


__all__ = ["add_rms_norm", "layer_norm", "layer_norm_1p", "rms_norm"]
