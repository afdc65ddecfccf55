"""Cross entropy over rows of logits [N, V]: the public ``cross_entropy``, its output and its custom ops.

* :func:`cross_entropy` returns :class:`CrossEntropyOutput` (also fused linear cross entropy's); its PyTorch path
  runs under autograd, its fused path computes the gradient in the forward, in a new buffer or, opt-in, over the
  logits (``inplace_backward=True``).
* ``ce_rows_for`` / ``row_scales`` (from ``triton_kernels``) give the row kernel of a decided backend.
* Every output of the op is a fresh tensor, written contiguous whatever the logits' layout; the fake says
  exactly that (``tests/kernels/test_opcheck.py`` checks it on both backends).
* In-place rule (:func:`check_inplace_logits`): the logits must be contiguous and not a partial view of a larger
  tensor (a slice, shifted logits: the rest of that tensor would keep logits beside the gradient); a view of the
  whole of a contiguous tensor (``logits.view(-1, V)``) is accepted. The shared version counter is bumped, so an
  autograd node that saved these logits fails at its backward with PyTorch's "modified by an inplace operation"
  error instead of computing a wrong gradient. Reading the logits after the call reads the gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from liger_registry.constants import IGNORE_INDEX
from liger_registry.limits import check_ignore_index, check_logit_factor

from ..backend import OPS, Op, register
from ..define import define_op, eager_twin
from ..loss_grads import check_backward, no_output, scale_unless_one_
from . import reference
from .labels import check_labels, start_label_check
from .triton_kernels import ce_rows_for


class CrossEntropyOutput(NamedTuple):
    """Returned when any ``return_*`` flag is set; fields not asked for are ``None``.

    ``token_accuracy``: the fraction (fp32) of non-ignored tokens whose argmax is the target (0 when none counts);
    ``predicted_tokens``: the argmax of each row, -1 on ignored rows (the reference library's convention)."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None
    token_accuracy: torch.Tensor | None
    predicted_tokens: torch.Tensor | None


def argmax_mode_for(return_token_accuracy: bool, return_predicted_tokens: bool) -> int:
    """The row kernels' argmax mode a call needs: 1 (non-ignored rows) when either field is asked for, else 0."""
    return 1 if (return_token_accuracy or return_predicted_tokens) else 0


def predicted_tokens(argmax: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The row argmax with -1 on ignored rows (whatever the kernel left there)."""
    return argmax.masked_fill(target == ignore_index, -1)


def token_accuracy(predicted: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Fraction of non-ignored rows predicted right, fp32 (0 when every row is ignored), no host sync."""
    valid = target != ignore_index
    n_correct = ((predicted == target) & valid).sum()
    return n_correct.to(torch.float32) / valid.sum().clamp(min=1)


def ce_output(
    loss: torch.Tensor,
    z_loss: torch.Tensor,
    accuracy: torch.Tensor | None,
    predicted: torch.Tensor | None,
    *,
    return_z_loss: bool,
    return_token_accuracy: bool,
    return_predicted_tokens: bool,
):
    """The loss alone, or a :class:`CrossEntropyOutput` with the fields asked for."""
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return loss
    return CrossEntropyOutput(
        loss,
        z_loss if return_z_loss else None,
        accuracy if return_token_accuracy else None,
        predicted if return_predicted_tokens else None,
    )


def reduce_ce(ce: torch.Tensor, zl: torch.Tensor, reduction, ce_scale, z_scale):
    """Combine per-row ce and z-loss as ``fused_linear_cross_entropy`` does, with the scales of
    :func:`reference.loss_scales`; returns fp32 (loss, z_loss)."""
    if reduction == "none":
        return ce + zl, zl
    if reduction == "sum":
        return ce.sum() + zl.sum(), zl.sum()
    z = zl.sum() * z_scale
    return ce.sum() * ce_scale + z, z


def cross_entropy_torch(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    lse_square_scale: float = 0.0,
    class_weights: torch.Tensor | None = None,
    argmax_mode: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``(loss, z_loss, predicted)``: ``predicted`` is the row argmax (-1 on ignored rows) when
    ``argmax_mode`` is set, else empty."""
    if not torch.compiler.is_compiling():  # traced: no graph break; gather checks the bounds (labels.py)
        check_labels(target, ignore_index, logits.shape[1])
    ce, zl = reference.ce_rows_differentiable(
        logits,
        target,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        softcap=softcap,
        lse_square_scale=lse_square_scale,
        class_weights=class_weights,
    )
    scales = reference.loss_scales(reduction, target, ignore_index, class_weights)
    loss, z = reduce_ce(ce, zl, reduction, *scales)
    if not argmax_mode:
        return loss, z, target.new_empty(0)
    z_rows = reference.transform_logits(logits.detach(), softcap, 1.0)
    return loss, z, predicted_tokens(z_rows.argmax(-1), target, ignore_index)


# ---------------------------------------------------------------- the fused path's custom op
def _ce_forward(
    logits,
    target,
    class_weights,
    ignore_index,
    label_smoothing,
    softcap,
    lse_square_scale,
    reduction,
    compute_grad,
    argmax_mode,
    backend,
    *,
    in_place: bool,
):
    """fp32 (loss, z_loss), grad and predicted tokens of rows of ``logits``; the gradient (for grad_output 1)
    and the row argmax (-1 on ignored rows; empty when ``argmax_mode`` is 0) come from the pass that reads the
    logits; the gradient goes into a new buffer, or over the logits themselves when ``in_place``."""
    target, finish_label_check = start_label_check(target, ignore_index, logits.shape[1])
    buf = logits if logits.stride(-1) == 1 else logits.contiguous()
    if not compute_grad:
        grad = buf.new_empty(0)
    else:
        grad = buf if in_place else torch.empty(buf.shape, dtype=buf.dtype, device=buf.device)
    ce_s, z_s = reference.loss_scales(reduction, target, ignore_index, class_weights)
    ce, zl, argmax = ce_rows_for(backend)(
        buf,
        target,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        softcap=softcap,
        logit_scale=1.0,
        lse_square_scale=lse_square_scale,
        class_weights=class_weights,
        ce_grad_scale=ce_s,
        z_grad_scale=z_s,
        row_grad=None,
        compute_grad=compute_grad,
        argmax_mode=argmax_mode,
        grad_out=grad if compute_grad and not in_place else None,
    )
    loss, z = reduce_ce(ce, zl, reduction, ce_s, z_s)
    argmax = predicted_tokens(argmax, target, ignore_index) if argmax_mode else target.new_empty(0)
    finish_label_check()  # after the kernels are queued: the host waits for the flag, not before launching
    if compute_grad and in_place:
        torch.autograd.graph.increment_version(
            logits
        )  # the version counter it shares with the tensor it views
        grad = logits.detach()
    return loss, z, grad, argmax


def _cross_entropy_fwd_impl(
    logits: Tensor,
    target: Tensor,
    class_weights: Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    lse_square_scale: float,
    reduction: str,
    compute_grad: bool,
    argmax_mode: int,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, grad, predicted); with ``compute_grad`` the gradient of the loss (for grad_output 1) is
    written into a new buffer in the same pass that reads the logits (the logits themselves are left
    untouched); ``predicted`` is [N] long when ``argmax_mode`` is set, else empty."""
    return _ce_forward(
        logits,
        target,
        class_weights,
        ignore_index,
        label_smoothing,
        softcap,
        lse_square_scale,
        reduction,
        compute_grad,
        argmax_mode,
        backend,
        in_place=False,
    )


def _cross_entropy_inplace_impl(*args) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """As :func:`_cross_entropy_fwd_impl`, the gradient written over the logits (eager only)."""
    return _ce_forward(*args, in_place=True)


def _cross_entropy_fake(
    logits,
    target,
    class_weights,
    ignore_index,
    label_smoothing,
    softcap,
    lse_square_scale,
    reduction,
    compute_grad,
    argmax_mode,
    backend,
):
    shape = (logits.shape[0],) if reduction == "none" else ()
    grad = (
        torch.empty_like(logits, memory_format=torch.contiguous_format)
        if compute_grad
        else logits.new_empty(0)
    )
    predicted = target.new_empty((logits.shape[0],) if argmax_mode else (0,))
    f32 = torch.float32
    return logits.new_empty(shape, dtype=f32), logits.new_empty(shape, dtype=f32), grad, predicted


def _scale_rows_impl(grad: Tensor, grad_output: Tensor) -> None:
    """grad *= grad_output, in place: a scalar (skipped when it is 1) or one factor per row."""
    if grad_output.dim() == 0:
        scale_unless_one_(grad, grad_output)
    else:
        grad.mul_(grad_output.to(grad.dtype)[:, None])


# explicit fake: it has no backend argument and returns nothing
SCALE_ROWS = define_op("scale_rows_", _scale_rows_impl, mutates_args=("grad",), fake=no_output)


def _ce_setup(ctx, inputs, output):
    ctx.save_for_backward(output[2])


def _ce_backward(ctx, grad, _gz, _gg, _gp):
    check_backward(ctx, "cross_entropy", once=True)
    (g,) = ctx.saved_tensors
    SCALE_ROWS.from_backward(ctx, g, grad)
    return g, None, None, None, None, None, None, None, None, None, None


_AUX = (1, 2, 3)  # z_loss, the saved gradient, the predicted tokens
# explicit fake: the label check reads the labels on the host (data-dependent), so the impl cannot run on fakes
CROSS_ENTROPY_FWD = define_op(
    "cross_entropy_fwd",
    _cross_entropy_fwd_impl,
    setup=_ce_setup,
    backward=_ce_backward,
    fake=_cross_entropy_fake,
    aux=_AUX,
)
# the in-place forward is eager only (a compiled graph cannot overwrite its input): an eager twin, no custom op
_CROSS_ENTROPY_INPLACE = eager_twin(
    "cross_entropy_inplace", _cross_entropy_inplace_impl, _ce_setup, _ce_backward, _AUX
).apply


def check_inplace_logits(logits: torch.Tensor) -> None:
    """Raise ValueError if ``inplace_backward=True`` may not overwrite these logits (see the module docstring)."""
    if not logits.is_contiguous():
        raise ValueError(
            "cross_entropy(inplace_backward=True) needs contiguous logits (the gradient is written over them); "
            f"got strides {logits.stride()} for shape {tuple(logits.shape)}: pass logits.contiguous() or "
            "inplace_backward=False"
        )
    base = logits._base
    if base is not None and (base.numel() != logits.numel() or base.data_ptr() != logits.data_ptr()):
        raise ValueError(
            "cross_entropy(inplace_backward=True) cannot overwrite a partial view of a larger tensor "
            f"(logits {tuple(logits.shape)} view a tensor of shape {tuple(base.shape)}: the rest of it would "
            "keep logits beside the gradient); pass the whole tensor, a copy, or inplace_backward=False"
        )


def cross_entropy_fused(
    logits,
    target,
    *,
    ignore_index=IGNORE_INDEX,
    label_smoothing=0.0,
    reduction="mean",
    softcap=None,
    lse_square_scale=0.0,
    class_weights=None,
    argmax_mode=0,
    inplace_backward=False,
    backend="triton",
):
    """fp32 ``(loss, z_loss, predicted)`` of cross entropy whose gradient is computed in the forward pass (the
    Triton path; ``backend="torch"`` runs the same contract with PyTorch row math). ``inplace_backward`` writes
    that gradient over the logits."""
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    args = (
        logits,
        target,
        class_weights,
        int(ignore_index),
        float(label_smoothing),
        None if softcap is None else float(softcap),
        float(lse_square_scale),
        reduction,
        compute_grad,
        int(argmax_mode),
        backend,
    )
    if inplace_backward:
        if torch.compiler.is_compiling():
            raise ValueError(
                "cross_entropy(inplace_backward=True) runs eagerly only (a compiled graph cannot overwrite its "
                "input); pass inplace_backward=False under torch.compile"
            )
        check_inplace_logits(logits)
        loss, z, _, predicted = _CROSS_ENTROPY_INPLACE(*args)
    else:
        loss, z, _, predicted = CROSS_ENTROPY_FWD(*args)
    return loss, z, predicted


def cross_entropy_triton(logits, target, **options):
    return cross_entropy_fused(logits, target, **options, backend="triton")


register(Op("cross_entropy", torch_impl=cross_entropy_torch, triton_impl=cross_entropy_triton))


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    lse_square_scale: float = 0.0,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    inplace_backward: bool = False,
):
    """Cross entropy over rows of ``logits`` [N, V]: ``F.cross_entropy`` (``weight``: class weights [V]; under
    ``mean`` the sum of the non-ignored targets' weights divides, as in torch) plus the options of
    :func:`fused_linear_cross_entropy` (``softcap``, z-loss ``lse_square_scale``); every target ignored gives 0.

    Accumulated in fp32, returned in the logits' dtype, as torch and the reference library return it. Returns
    the loss, or :class:`CrossEntropyOutput` when a ``return_*`` flag is set: ``z_loss`` (in the logits' dtype),
    ``token_accuracy`` (fp32, over non-ignored rows), ``predicted_tokens`` (row argmax, -1 on ignored rows).

    ``inplace_backward=True`` (opt-in) writes the gradient over ``logits`` in the forward pass when one is needed:
    the caller's logits hold d loss / d logits afterwards. It saves one [N, V] buffer and its write bandwidth
    (the reference library's default). Logits must be contiguous and not a partial view of a larger tensor
    (ValueError otherwise); another autograd node that saved them fails at backward with PyTorch's in-place
    error; eager only (ValueError under torch.compile); one backward, no double backward. See the module
    docstring of ``kernels.ce.op``."""
    reference.check_ce_options(label_smoothing, softcap, reduction)
    check_ignore_index(ignore_index)
    if softcap is not None:
        check_logit_factor("softcap", float(softcap))
    if logits.dim() != 2 or target.shape != (logits.shape[0],):
        raise ValueError(
            f"logits must be [N, V] and target [N]; got {tuple(logits.shape)}, {tuple(target.shape)}"
        )
    if weight is not None and weight.shape != (logits.shape[1],):
        raise ValueError(f"weight must be [V]={logits.shape[1]}; got {tuple(weight.shape)}")
    options = dict(
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
        softcap=softcap,
        lse_square_scale=lse_square_scale,
        class_weights=weight,
        argmax_mode=argmax_mode_for(return_token_accuracy, return_predicted_tokens),
    )
    op = OPS["cross_entropy"]
    if not inplace_backward:
        loss, z_loss, predicted = op(logits, target, **options)
    else:
        backend, _ = op.decide(logits, target, **options)
        loss, z_loss, predicted = cross_entropy_fused(
            logits, target, **options, inplace_backward=True, backend=backend
        )
    accuracy = token_accuracy(predicted, target, ignore_index) if return_token_accuracy else None
    return ce_output(
        loss.to(logits.dtype),
        z_loss.to(logits.dtype),
        accuracy,
        predicted,
        return_z_loss=return_z_loss,
        return_token_accuracy=return_token_accuracy,
        return_predicted_tokens=return_predicted_tokens,
    )
