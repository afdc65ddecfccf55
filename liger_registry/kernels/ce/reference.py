"""Cross-entropy row math in PyTorch, shared by ``cross_entropy`` and fused linear cross entropy.

* ``ce_rows_torch``: the Triton rows kernel's twin (loss, z-loss, argmax and the gradient written over the chunk);
  ``ce_rows_differentiable``: the same under autograd.
* Semantics of ``torch.nn.functional.cross_entropy`` (label smoothing, class weights; mean divides by the sum of
  the weights of the non-ignored targets), plus ``softcap`` (``s * tanh(z / s)``), ``logit_scale`` (applied
  before the softcap) and z-loss (``lse_square_scale * lse**2`` per non-ignored token, unweighted; under
  ``mean`` divided by the number of non-ignored tokens).
"""

from __future__ import annotations

import torch

from liger_registry.constants import IGNORE_INDEX
from liger_registry.limits import check_reduction


def check_ce_options(label_smoothing: float, softcap: float | None, reduction: str) -> None:
    check_reduction(reduction)
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if softcap is not None and not float(softcap) > 0.0:
        raise ValueError(f"softcap must be > 0 or None, got {softcap}")


def valid_target_weights(
    target: torch.Tensor, valid: torch.Tensor, class_weights: torch.Tensor
) -> torch.Tensor:
    """fp32 class weight of each row's target, 0 on ignored rows."""
    safe = torch.where(valid, target, torch.zeros_like(target))
    return class_weights.to(torch.float32)[safe] * valid


def loss_scales(reduction: str, target: torch.Tensor, ignore_index: int, class_weights: torch.Tensor | None):
    """``(ce_scale, z_scale)`` of a loss (fp32 tensors, no sync; ``(1.0, 1.0)`` unless ``mean``).

    Under ``mean`` the CE term is divided as ``F.cross_entropy`` divides it: by the number of non-ignored
    tokens, or with class weights by the sum of their targets' weights, whatever its sign (a zero sum gives
    +-inf, and 0 / 0 = nan when every such weight is 0, as torch does); the z term by the number of non-ignored
    tokens. When no token counts both scales are 0 (loss 0, zero gradients: the reference library's rule, where
    torch gives 0 / 0)."""
    if reduction != "mean":
        return 1.0, 1.0
    valid = target != ignore_index
    n_valid = valid.sum().to(torch.float32)
    if class_weights is None:
        ce_scale = 1.0 / n_valid
    else:
        w = valid_target_weights(target, valid, class_weights)
        # every counted target weighs 0: torch's 0 / 0 (its label-smoothing term too, divided by the same sum)
        ce_scale = torch.where(w.ne(0).any(), 1.0 / w.sum(), torch.full_like(n_valid, float("nan")))
    counted = n_valid > 0
    return torch.where(counted, ce_scale, torch.zeros_like(ce_scale)), 1.0 / n_valid.clamp(min=1.0)


def transform_logits(raw: torch.Tensor, softcap: float | None, logit_scale: float) -> torch.Tensor:
    """fp32 logits after scale and softcap."""
    z = raw.to(torch.float32)
    if logit_scale != 1.0:
        z = z * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return z


def corrected_lse(lse: torch.Tensor, zy_rounded: torch.Tensor, zy_exact: torch.Tensor) -> torch.Tensor:
    """``log(exp(lse) - exp(zy_rounded) + exp(zy_exact))``: the row's sum-exp with its target term exact."""
    return lse + torch.log1p(torch.exp(zy_exact - lse) - torch.exp(zy_rounded - lse))


def ce_rows_differentiable(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    lse_square_scale: float = 0.0,
    class_weights: torch.Tensor | None = None,
):
    """Per-row (ce, z_loss) in fp32 with autograd; ignored rows are 0. ``ce`` includes the class weight."""
    z = transform_logits(logits, softcap, logit_scale)
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    lse = torch.logsumexp(z, dim=-1)
    logp = z - lse[:, None]
    v = z.shape[-1]
    if class_weights is None:
        nll = -logp.gather(1, safe[:, None]).squeeze(1)
        smooth = -logp.sum(-1) / v
    else:
        w = class_weights.to(torch.float32)
        nll = -logp.gather(1, safe[:, None]).squeeze(1) * w[safe]
        smooth = -(logp * w).sum(-1) / v
    ce = (1.0 - label_smoothing) * nll + label_smoothing * smooth if label_smoothing else nll
    zl = lse_square_scale * lse * lse
    zero = torch.zeros((), dtype=torch.float32, device=z.device)
    return torch.where(valid, ce, zero), torch.where(valid, zl, zero)


@torch.no_grad()
def ce_rows_torch(
    buf: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    logit_scale: float,
    lse_square_scale: float,
    class_weights: torch.Tensor | None,
    ce_grad_scale: torch.Tensor | float,
    z_grad_scale: torch.Tensor | float,
    row_grad: torch.Tensor | None,
    compute_grad: bool,
    argmax_mode: int = 2,
    scales: torch.Tensor | None = None,
    out: tuple | None = None,
    grad_out: torch.Tensor | None = None,
    target_logit: torch.Tensor | None = None,
):
    """Loss rows of a logits chunk; with ``compute_grad`` the chunk is overwritten with d loss / d raw logits.

    ``target_logit`` (fp32 [N], ``target``): the exact transformed target logit, used instead of the chunk's
    (rounded) one in the loss and in the row's lse.

    ``buf`` holds raw logits ``hidden @ W.T + b`` (any float dtype); the gradient of the ce term is scaled by
    ``ce_grad_scale``, that of the z term by ``z_grad_scale``, and each row by ``row_grad`` (if given).
    Returns fp32 ``(ce_rows, z_rows, argmax)``; ignored rows have 0 loss and 0 gradient.
    """
    z = transform_logits(buf, softcap, logit_scale)
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    v = z.shape[-1]
    lse = torch.logsumexp(z, dim=-1)
    argmax = z.argmax(-1)
    z_y = z.gather(1, safe[:, None]).squeeze(1)
    if target_logit is not None:
        lse = torch.where(valid, corrected_lse(lse, z_y, target_logit), lse)
        z_y = target_logit
    eps = float(label_smoothing)
    if class_weights is None:
        w_y = torch.ones_like(lse)
        nll = lse - z_y
        smooth = lse - z.sum(-1) / v
    else:
        w = class_weights.to(torch.float32)
        w_y = w[safe]
        nll = (lse - z_y) * w_y
        smooth = (w.sum() * lse - (z * w).sum(-1)) / v
    ce = (1.0 - eps) * nll + eps * smooth if eps else nll
    zl = lse_square_scale * lse * lse
    zero = torch.zeros((), dtype=torch.float32, device=z.device)
    ce = torch.where(valid, ce, zero)
    zl = torch.where(valid, zl, zero)
    if compute_grad:
        p = torch.exp(z - lse[:, None])
        # d ce / dz
        a = (1.0 - eps) * w_y
        if eps:
            s_w = float(v) if class_weights is None else class_weights.to(torch.float32).sum()
            coef_p = a + eps * s_w / v
        else:
            coef_p = a
        g = p * (coef_p * ce_grad_scale + 2.0 * lse_square_scale * lse * z_grad_scale)[:, None]
        g.scatter_add_(1, safe[:, None], (-a * ce_grad_scale)[:, None])
        if eps:
            if class_weights is None:
                g -= eps / v * ce_grad_scale
            else:
                g -= (eps / v) * class_weights.to(torch.float32)[None, :] * ce_grad_scale
        rows = valid.to(torch.float32)
        if row_grad is not None:
            rows = rows * row_grad.to(torch.float32)
        g *= rows[:, None]
        if softcap is not None:
            t = z / softcap
            g *= 1.0 - t * t
        if logit_scale != 1.0:
            g *= logit_scale
        (buf if grad_out is None else grad_out).copy_(g)
    if out is not None:
        for dst, src in zip(out, (ce, zl, argmax), strict=True):
            if dst is not None:
                dst.copy_(src)
        return out
    return ce, zl, argmax
