"""RMSNorm, LayerNorm and fused add + RMSNorm in PyTorch: the twin of the Triton kernels.

* ``rms_norm_torch`` / ``layer_norm_torch`` / ``add_rms_norm_torch``: the CPU path and the tests' reference,
  computed as the Hugging Face modules compute them (per casting mode).
* ``rms_norm_bwd_torch`` / ``layer_norm_bwd_torch``: the explicit backward formulas the ops' torch branches run
  (autograd does not record inside a custom op's implementation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CASTING_MODES = ("llama", "gemma", "none")


def check_casting_mode(casting_mode: str) -> str:
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode={casting_mode!r}; expected one of {', '.join(CASTING_MODES)}")
    return casting_mode


def rms_norm_torch(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> torch.Tensor:
    """RMSNorm over the last dimension, ``y = x / rms(x) * (offset + weight)``; without a weight (``None``: no
    elementwise affine, ``nn.RMSNorm(elementwise_affine=False)``) ``y = x / rms(x)`` and ``offset`` does not
    apply.

    Casting modes (as Liger documents them); they exist because the HF families disagree on where the
    cast back to the input dtype happens, and bf16 results differ in the last bit otherwise:

    * ``"llama"``: x is upcast to fp32 only to compute and apply 1/rms; the normalised x is cast back to
      the input dtype and *then* multiplied by ``(offset + weight)`` in the weight's dtype. With
      ``offset=0`` this is exactly HF ``LlamaRMSNorm`` (Llama, Mistral, Qwen2/3, GPT-OSS, ...).
    * ``"gemma"``: everything in fp32, ``x_norm * (offset + weight.float())``, then cast to the input
      dtype. With ``offset=1.0`` this is exactly HF ``GemmaRMSNorm`` / ``Gemma3RMSNorm``.
    * ``"none"``: everything in the input dtype (no upcast at all).
    """
    check_casting_mode(casting_mode)
    input_dtype = x.dtype
    if casting_mode == "llama":
        xf = x.to(torch.float32)
        variance = xf.pow(2).mean(-1, keepdim=True)
        xn = (xf * torch.rsqrt(variance + eps)).to(input_dtype)
        if weight is None:
            return xn
        w = weight if offset == 0.0 else (offset + weight)
        return w * xn
    if casting_mode == "gemma":
        xf = x.float()
        xn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (xn if weight is None else xn * (offset + weight.float())).type_as(x)
    variance = x.pow(2).mean(-1, keepdim=True)
    xn = x * torch.rsqrt(variance + eps)
    return xn if weight is None else xn * (offset + weight.to(input_dtype))


def add_rms_norm_torch(x, residual, weight, eps: float, offset: float = 0.0, casting_mode: str = "llama"):
    """The eager add, then the RMSNorm of the casting mode: ``(residual + x, rmsnorm(residual + x))``; weight
    ``None``: no scale, as :func:`rms_norm_torch`."""
    s = residual + x
    return s, rms_norm_torch(s, weight, eps, offset, casting_mode)


def layer_norm_torch(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dimension (``torch.nn.functional.layer_norm``); weight / bias None: none."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm_bwd_torch(dy, x, weight, eps: float, offset: float, casting_mode: str, need_dw: bool):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    dyf = dy.float()
    dxhat = dyf if weight is None else dyf * (offset + weight.float())
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    dw = None
    if need_dw and weight is not None:
        xh = xhat.to(x.dtype).float() if casting_mode == "llama" else xhat
        dw = (dyf * xh).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return dx.to(x.dtype), dw


def layer_norm_bwd_torch(dy, x, weight, bias, eps: float, need_dw: bool, need_db: bool):
    xf = x.float()
    var, mean = torch.var_mean(xf, -1, keepdim=True, unbiased=False)
    rstd = torch.rsqrt(var + eps)
    xhat = (xf - mean) * rstd
    dyf = dy.float()
    wdy = dyf if weight is None else dyf * weight.float()
    dx = (wdy - xhat * (xhat * wdy).mean(-1, keepdim=True) - wdy.mean(-1, keepdim=True)) * rstd
    h = x.shape[-1]
    dw = (dyf * xhat).reshape(-1, h).sum(0).to(weight.dtype) if need_dw and weight is not None else None
    db = dyf.reshape(-1, h).sum(0).to(bias.dtype) if (need_db and bias is not None) else None
    return dx.to(x.dtype), dw, db
