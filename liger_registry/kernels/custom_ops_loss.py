"""``torch.library`` custom ops of the losses: cross entropy rows, FLCE forward/backward, fused linear JSD.

Layouts: every output is a fresh tensor, written contiguous whatever the inputs' layouts (logits or hidden rows
with a larger stride, a transposed view): the gradients are read back row by row, and the fakes say exactly that
(``tests/kernels/test_opcheck.py`` checks them on both backends).
"""

from __future__ import annotations

import torch
from torch import Tensor

from liger_registry.constants import IGNORE_INDEX

from . import ce_torch
from .backward_once import check_backward
from .ce_inplace import check_inplace_logits, mark_overwritten
from .ce_output import predicted_tokens
from .ce_rows import ce_rows_for
from .cross_entropy import reduce_ce
from .custom_ops import NS, _call, _eager_function
from .flce_loop import flce_compute
from .flce_run import FlceRun, takes_flat_run
from .jsd_loop import fljsd_compute
from .labels import start_label_check
from .scale_unless_one import scale_unless_one_


# ---------------------------------------------------------------- cross entropy over logits rows
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
    ce_s, z_s = ce_torch.loss_scales(reduction, target, ignore_index, class_weights)
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
        mark_overwritten(logits)
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
    """As :func:`_cross_entropy_fwd_impl`, the gradient written over the logits (eager only; see ce_inplace)."""
    return _ce_forward(*args, in_place=True)


cross_entropy_fwd = torch.library.custom_op(
    f"{NS}::cross_entropy_fwd", _cross_entropy_fwd_impl, mutates_args=()
)


@cross_entropy_fwd.register_fake
def _(
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


scale_rows_ = torch.library.custom_op(f"{NS}::scale_rows_", _scale_rows_impl, mutates_args=("grad",))


@scale_rows_.register_fake
def _(grad, grad_output):
    return None


def _ce_setup(ctx, inputs, output):
    ctx.save_for_backward(output[2])


def _ce_backward(ctx, grad, _gz, _gg, _gp):
    check_backward(ctx, "cross_entropy", once=True)
    (g,) = ctx.saved_tensors
    (_scale_rows_impl if getattr(ctx, "eager", False) else scale_rows_)(g, grad)
    return g, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd(f"{NS}::cross_entropy_fwd", _ce_backward, setup_context=_ce_setup)


_CrossEntropyFn = _eager_function(
    "_CrossEntropyFn", _cross_entropy_fwd_impl, _ce_setup, _ce_backward, aux=(1, 2, 3)
)
_CrossEntropyInPlaceFn = _eager_function(
    "_CrossEntropyInPlaceFn", _cross_entropy_inplace_impl, _ce_setup, _ce_backward, aux=(1, 2, 3)
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
        loss, z, _, predicted = _CrossEntropyInPlaceFn.apply(*args)
    else:
        loss, z, _, predicted = _call(cross_entropy_fwd, _CrossEntropyFn, *args)
    return loss, z, predicted


def cross_entropy_triton(logits, target, **options):
    return cross_entropy_fused(logits, target, **options, backend="triton")


# ---------------------------------------------------------------- fused linear cross entropy
def _or_empty(t: Tensor | None, like: Tensor) -> Tensor:
    return like.new_empty(0) if t is None else t


@torch.library.custom_op(f"{NS}::flce_forward", mutates_args=())
@takes_flat_run
def flce_forward(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    class_weights: Tensor | None,
    row_grad: Tensor | None,
    need_dh: bool,
    need_dw: bool,
    need_db: bool,
    *flat_run,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`flce_loop.flce_compute` with the :class:`FlceRun` flattened (``FlceRun.flat``); absent gradients
    are empty tensors. (loss, z_loss, n_correct, argmax, dh, dw, db)."""
    run = FlceRun.from_flat(*flat_run)
    loss, z, n_correct, argmax, dh, dw, db = flce_compute(
        hidden, weight, target, bias, class_weights, row_grad, run, (need_dh, need_dw, need_db)
    )
    return loss, z, n_correct, argmax, _or_empty(dh, hidden), _or_empty(dw, hidden), _or_empty(db, hidden)


@flce_forward.register_fake
def _(hidden, weight, target, bias, class_weights, row_grad, need_dh, need_dw, need_db, *flat_run):
    run = FlceRun.from_flat(*flat_run)
    n = hidden.shape[0]
    shape = (n,) if run.options.reduction == "none" else ()
    f32 = torch.float32
    return (
        hidden.new_empty(shape, dtype=f32),
        hidden.new_empty(shape, dtype=f32),
        hidden.new_empty((), dtype=torch.long),
        hidden.new_empty((n,) if run.argmax_mode else (0,), dtype=torch.long),
        torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_dh else hidden.new_empty(0),
        torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dw else hidden.new_empty(0),
        bias.new_empty(bias.shape) if (need_db and bias is not None) else hidden.new_empty(0),
    )


def flce_run_forward(hidden, weight, target, bias, class_weights, row_grad, need, run: FlceRun):
    """FLCE forward: the custom op under torch.compile, the plain function in eager mode."""
    if torch.compiler.is_compiling():
        return flce_forward(hidden, weight, target, bias, class_weights, row_grad, *need, *run.flat())
    return flce_compute(hidden, weight, target, bias, class_weights, row_grad, run, need)


def _scale_grads_impl(dh: Tensor | None, dw: Tensor | None, db: Tensor | None, grad_output: Tensor) -> None:
    """Scales the precomputed gradients in place by the (scalar) grad_output; a no-op when it is 1, decided on
    the device (``scale_unless_one``: no host sync)."""
    for t in (dh, dw, db):
        if t is not None and t.numel():
            scale_unless_one_(t, grad_output)


flce_scale_grads_ = torch.library.custom_op(
    f"{NS}::flce_scale_grads_", _scale_grads_impl, mutates_args=("dh", "dw", "db")
)


@flce_scale_grads_.register_fake
def _(dh, dw, db, grad_output):
    return None


def flce_scale_grads(dh: Tensor | None, dw: Tensor | None, db: Tensor | None, grad_output: Tensor) -> None:
    """The custom op under torch.compile (where absent gradients are empty tensors), the plain function eagerly."""
    if torch.compiler.is_compiling():
        flce_scale_grads_(dh, dw, db, grad_output)
    else:
        _scale_grads_impl(dh, dw, db, grad_output)


# ---------------------------------------------------------------- fused linear JSD
@torch.library.custom_op(f"{NS}::fljsd_forward", mutates_args=())
def fljsd_forward(
    sh: Tensor,
    sw: Tensor,
    th: Tensor,
    tw: Tensor,
    target: Tensor | None,
    beta: float,
    temperature: float,
    ignore_index: int,
    chunk_mem_const: int,
    need_dh: bool,
    need_dw: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    loss, dh, dw = fljsd_compute(
        sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend
    )
    return loss, sh.new_empty(0) if dh is None else dh, sh.new_empty(0) if dw is None else dw


@fljsd_forward.register_fake
def _(sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend):
    return (
        sh.new_empty((), dtype=torch.float32),
        torch.empty_like(sh, memory_format=torch.contiguous_format) if need_dh else sh.new_empty(0),
        torch.empty_like(sw, memory_format=torch.contiguous_format) if need_dw else sh.new_empty(0),
    )
