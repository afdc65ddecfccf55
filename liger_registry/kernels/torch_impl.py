"""PyTorch implementations of the elementwise/normalisation ops: the production CPU path (and the test reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

CASTING_MODES = ("llama", "gemma", "none")


def check_casting_mode(casting_mode: str) -> str:
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode={casting_mode!r}; expected one of {', '.join(CASTING_MODES)}")
    return casting_mode


def rms_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0, casting_mode: str = "llama"
) -> torch.Tensor:
    """RMSNorm over the last dimension, ``y = x / rms(x) * (offset + weight)``.

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
        w = weight if offset == 0.0 else (offset + weight)
        return w * xn
    if casting_mode == "gemma":
        xf = x.float()
        xn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (xn * (offset + weight.float())).type_as(x)
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * (offset + weight.to(input_dtype))


def layer_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dimension (``torch.nn.functional.layer_norm``)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def swiglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, the activation rounded to the gate's dtype before the multiply (as ``LlamaMLP``)."""
    return F.silu(gate) * up


def geglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up``, rounded as :func:`swiglu_torch` (as ``GemmaMLP``)."""
    return F.gelu(gate, approximate="tanh") * up


# ------------------------------------------------------------------ explicit backwards (torch), the formulas
# the Triton kernels implement; used by the custom ops when they run with the torch backend (autograd is
# not recording inside a custom op's implementation).
def rms_norm_bwd_torch(dy, x, weight, eps: float, offset: float, casting_mode: str, need_dw: bool):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    dyf = dy.float()
    dxhat = dyf * (offset + weight.float())
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    dw = None
    if need_dw:
        xh = xhat.to(x.dtype).float() if casting_mode == "llama" else xhat
        dw = (dyf * xh).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return dx.to(x.dtype), dw


def layer_norm_bwd_torch(dy, x, weight, bias, eps: float, need_dw: bool, need_db: bool):
    xf = x.float()
    var, mean = torch.var_mean(xf, -1, keepdim=True, unbiased=False)
    rstd = torch.rsqrt(var + eps)
    xhat = (xf - mean) * rstd
    dyf = dy.float()
    wdy = dyf * weight.float()
    dx = (wdy - xhat * (xhat * wdy).mean(-1, keepdim=True) - wdy.mean(-1, keepdim=True)) * rstd
    h = x.shape[-1]
    dw = (dyf * xhat).reshape(-1, h).sum(0).to(weight.dtype) if need_dw else None
    db = dyf.reshape(-1, h).sum(0).to(weight.dtype) if (need_db and bias is not None) else None
    return dx.to(x.dtype), dw, db


def glu_bwd_torch(dc, gate, up, kind: int):
    a, b, d = gate.float(), up.float(), dc.float()
    if kind == 0:
        sig = torch.sigmoid(a)
        dact = sig * (1 + a * (1 - sig))
        act = F.silu(gate)
    else:
        k = 0.7978845608028654
        t = torch.tanh(k * (a + 0.044715 * a**3))
        dact = 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a)
        act = F.gelu(gate, approximate="tanh")
    # d up: the activation as the forward multiplied it, rounded to the gate's dtype
    return (d * b * dact).to(gate.dtype), (d * act.float()).to(up.dtype)
