"""Fused linear cross entropy: the loss of ``softcap((hidden @ W.T + b) * scale)`` without the logits.

* :func:`fused_linear_cross_entropy` and its autograd Function :class:`FusedLinearCrossEntropyFunction`.
* ``flce_compute``: one call (loss scales, the planned strategy's chunk loop, the reduction of its rows).
* Custom ops ``flce_forward`` (that computation; under torch.compile one opaque node, eagerly the plain
  function) and ``flce_scale_grads_`` (the backward's in-place scaling); ``FUSED_LINEAR_CROSS_ENTROPY``: the
  registered backend Op.
* Every output is a fresh tensor, written contiguous whatever the inputs' layouts; the fakes say exactly that
  (``tests/kernels/test_opcheck.py`` checks them on both backends).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from ..backend import Op, register
from ..ce.labels import start_label_check
from ..ce.op import CrossEntropyOutput, argmax_mode_for, ce_output, predicted_tokens
from ..ce.reference import loss_scales
from ..define import define_op
from ..loss_grads import check_backward, no_output, scale_unless_one_, times_fp32
from .options import FlceOptions, FlceRun, options_from, takes_flat_run
from .plan import FlcePlan, plan_for
from .tokens import token_loop
from .vocab import vocab_loop

STRATEGY_LOOPS = {"tokens": token_loop, "vocab": vocab_loop}


FLCEOutput = CrossEntropyOutput  # the name this output had before cross_entropy returned it too


def flce_compute(
    hidden, weight, target, bias, class_weights, row_grad, run: FlceRun, need: tuple[bool, bool, bool]
):
    """One call's computation: ``(loss, z_loss, n_correct, argmax, dh, dw, db)``.

    ``loss``/``z_loss`` are reduced (or per token for ``none``); the gradients are those of ``loss`` (times
    ``row_grad`` per token when given), ``None`` where ``need`` (dh, dw, db) says so; ``argmax`` is [N] (-1 on
    ignored rows) or empty.
    """
    opts = run.options
    device = hidden.device
    finish_label_check = None
    if row_grad is None:  # the forward; a recomputing backward (reduction none) reads labels already checked
        target, finish_label_check = start_label_check(target, opts.ignore_index, weight.shape[0])
    ce_scale, z_scale = loss_scales(opts.reduction, target, opts.ignore_index, class_weights)
    loop = STRATEGY_LOOPS[run.strategy]
    ce, z, argmax, dh, dw, db = loop(
        hidden, weight, target, bias, class_weights, row_grad, run, need, ce_scale, z_scale
    )
    zero = torch.zeros((), dtype=torch.float32, device=device)
    if opts.reduction == "none":
        z_loss = z if z is not None else torch.zeros_like(ce)
        loss = ce + z if z is not None else ce
    elif opts.reduction == "sum":
        z_loss = z if z is not None else zero
        loss = ce + z_loss
    else:
        z_loss = z * z_scale if z is not None else zero
        loss = ce * ce_scale + z_loss
    if argmax is not None:
        argmax = predicted_tokens(argmax, target, opts.ignore_index)
        n_correct = ((argmax == target) & (target != opts.ignore_index)).sum()
    else:
        n_correct = torch.zeros((), dtype=torch.long, device=device)
        argmax = torch.empty(0, dtype=torch.long, device=device)
    if dw is not None and dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    if db is not None:
        db = db.to(bias.dtype)
    if finish_label_check is not None:
        finish_label_check()  # everything is queued: the host waits only for the label flag, not for the GPU
    return loss, z_loss, n_correct, argmax, dh, dw, db


def _or_empty(t: Tensor | None, like: Tensor) -> Tensor:
    return like.new_empty(0) if t is None else t


@takes_flat_run
def _flce_forward_impl(
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
    """:func:`flce_compute` with the :class:`FlceRun` flattened (``FlceRun.flat``: one typed argument per field,
    from the options table); absent gradients are empty tensors. (loss, z_loss, n_correct, argmax, dh, dw, db)."""
    run = FlceRun.from_flat(*flat_run)
    loss, z, n_correct, argmax, dh, dw, db = flce_compute(
        hidden, weight, target, bias, class_weights, row_grad, run, (need_dh, need_dw, need_db)
    )
    return loss, z, n_correct, argmax, _or_empty(dh, hidden), _or_empty(dw, hidden), _or_empty(db, hidden)


def _flce_forward_fake(
    hidden, weight, target, bias, class_weights, row_grad, need_dh, need_dw, need_db, *flat_run
):
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


# explicit fake: the backend is not the op's last argument (argmax_mode is) and the label check reads the labels
# on the host; the autograd is FusedLinearCrossEntropyFunction's (public), so the op defines none
FLCE_FORWARD = define_op("flce_forward", _flce_forward_impl, fake=_flce_forward_fake)


def flce_run_forward(hidden, weight, target, bias, class_weights, row_grad, need, run: FlceRun):
    """:data:`FLCE_FORWARD` on a :class:`FlceRun`; absent gradients come back as empty tensors."""
    return FLCE_FORWARD(hidden, weight, target, bias, class_weights, row_grad, *need, *run.flat())


def _scale_grads_impl(dh: Tensor | None, dw: Tensor | None, db: Tensor | None, grad_output: Tensor) -> None:
    """Scales the precomputed gradients in place by the (scalar) grad_output; a no-op when it is 1, decided on
    the device (``scale_unless_one_``: no host sync)."""
    for t in (dh, dw, db):
        if t is not None and t.numel():
            scale_unless_one_(t, grad_output)


# explicit fake: the op has no backend argument and returns nothing (it scales its arguments in place)
FLCE_SCALE_GRADS = define_op(
    "flce_scale_grads_", _scale_grads_impl, mutates_args=("dh", "dw", "db"), fake=no_output
)


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd Function of FLCE: ``(hidden, weight, target, bias, class_weights, run: FlceRun)`` ->
    ``(loss, z_loss, n_correct, argmax)``.

    For ``mean``/``sum`` the forward computes the gradients chunk by chunk and the backward only scales them by
    ``grad_output`` (in place: a second backward works only with grad_output 1, else a clear error saying which
    option to use); for ``none`` the forward keeps the inputs and the backward recomputes with the per-token
    ``grad_output`` (the only exact way without storing [N, V]). Under torch.compile the work happens in
    ``torch.ops.liger_registry.flce_forward``, one opaque custom op.
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, class_weights, run: FlceRun):
        need = (
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[3],
        )
        grads_now = run.options.reduction != "none"
        loss, z_loss, n_correct, argmax, dh, dw, db = flce_run_forward(
            hidden,
            weight,
            target,
            bias,
            class_weights,
            None,
            need if grads_now else (False, False, False),
            run,
        )
        ctx.need, ctx.run, ctx.grads_now = need, run, grads_now
        if grads_now:
            ctx.save_for_backward(dh, dw, db)
        else:
            ctx.save_for_backward(hidden, weight, target, bias, class_weights)
        ctx.mark_non_differentiable(z_loss, n_correct, argmax)
        return loss, z_loss, n_correct, argmax

    @staticmethod
    def backward(ctx, grad_loss, *_):
        check_backward(ctx, "fused_linear_cross_entropy", once=ctx.grads_now)
        need_dh, need_dw, need_db = ctx.need
        if ctx.grads_now:
            dh, dw, db = _saved_gradients(ctx)
            if torch.compiler.is_compiling():
                dh, dw, db = (_scaled(t, grad_loss) for t in (dh, dw, db))
            else:
                FLCE_SCALE_GRADS(dh, dw, db, grad_loss)
        else:
            hidden, weight, target, bias, class_weights = ctx.saved_tensors
            run = replace(ctx.run, argmax_mode=0)
            *_, dh, dw, db = flce_run_forward(
                hidden, weight, target, bias, class_weights, grad_loss, ctx.need, run
            )
        return (
            (dh if need_dh else None),
            (dw if need_dw else None),
            None,
            (db if need_db else None),
            None,
            None,
        )


SECOND_BACKWARD = (
    "fused_linear_cross_entropy (reduction mean/sum) computes its gradients in the forward and scales them in "
    "place in the backward, so a second backward through the same loss with a grad_output other than 1 "
    "(retain_graph=True twice, autograd.grad twice, gradient penalties) cannot be served. Use reduction='none' "
    "(recomputes in the backward), or patch with fused_linear_cross_entropy=False (logits and the model's loss)."
)


def _scaled(t: Tensor, grad_output: Tensor) -> Tensor:
    """``t * grad_output`` out of place, rounded as the in-place kernel rounds: the traced backward's form, where
    functionalisation would turn the in-place scale of a saved tensor into a copy of it plus the scale (two passes
    over dW, one here)."""
    if not t.numel():
        return t
    return times_fp32(t, grad_output).to(t.dtype)


def _saved_gradients(ctx):
    try:
        return ctx.saved_tensors
    except RuntimeError as exc:
        if "inplace operation" in str(exc):
            raise RuntimeError(SECOND_BACKWARD) from exc
        raise


def _flce_on(backend: str):
    def run(
        hidden, weight, target, bias, class_weights, options: FlceOptions, plan: FlcePlan, argmax_mode: int
    ):
        flce_run = FlceRun(options, plan.strategy, plan.chunk, backend, argmax_mode)
        return FusedLinearCrossEntropyFunction.apply(hidden, weight, target, bias, class_weights, flce_run)

    return run


FUSED_LINEAR_CROSS_ENTROPY = register(
    Op(
        "fused_linear_cross_entropy",
        torch_impl=_flce_on("torch"),
        triton_impl=_flce_on("triton"),
    )
)


def check_head_shapes(hidden, weight, target, bias, class_weights=None) -> None:
    """A head's operands: hidden [N, H], weight [V, H], target [N], bias and class weights [V] (the RL head too)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if target.shape != (hidden.shape[0],):
        raise ValueError(f"target must be [N]={hidden.shape[0]}; got {tuple(target.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [V]={weight.shape[0]}; got {tuple(bias.shape)}")
    if class_weights is not None and class_weights.shape != (weight.shape[0],):
        raise ValueError(f"class_weights must be [V]={weight.shape[0]}; got {tuple(class_weights.shape)}")


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    options: FlceOptions | None = None,
    class_weights: torch.Tensor | None = None,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    **option_fields,
):
    """Cross entropy of ``softcap((hidden @ weight.T + bias) * logit_scale)`` without materialising [N, V].

    hidden [N, H], weight [V, H], target [N] (long), bias [V] or None. Options come as one :class:`FlceOptions`
    (``options=``) or as its fields one by one (``ignore_index=``, ``label_smoothing=``, ``softcap=``,
    ``logit_scale=``, ``lse_square_scale=``, ``reduction=``, ``accum_dtype=``, ``chunk_mem_const=``,
    ``max_chunk_mib=``, ``strategy=``); not both. Loss in fp32, semantics of ``F.cross_entropy`` (label
    smoothing, class weights) plus z-loss (``lse_square_scale * lse**2`` per non-ignored token, added to the
    loss; ``mean`` divides it by the number of non-ignored tokens). All targets ignored -> loss 0 with zero
    gradients. Chunked as :func:`flce_plan` plans it within the budget of the options.
    Gradients come back in hidden's / weight's dtype; ``accum_dtype=torch.float32`` accumulates dW in fp32.
    Returns the loss, or :class:`CrossEntropyOutput` when any ``return_*`` flag is set (``token_accuracy`` is
    the fraction of non-ignored tokens whose argmax is the target; ``predicted_tokens`` the argmax of each row,
    -1 on ignored rows).
    """
    opts = options_from(options, option_fields)
    check_head_shapes(hidden, weight, target, bias, class_weights)
    weight_grad = weight.requires_grad and torch.is_grad_enabled()
    plan = plan_for(
        hidden.shape[0], hidden.shape[1], weight.shape[0], opts, hidden.dtype, hidden.device, weight_grad
    )
    argmax_mode = argmax_mode_for(return_token_accuracy, return_predicted_tokens)
    loss, z_loss, n_correct, argmax = FUSED_LINEAR_CROSS_ENTROPY(
        hidden, weight, target, bias, class_weights, opts, plan, argmax_mode
    )
    acc = None
    if return_token_accuracy:
        acc = n_correct.to(torch.float32) / (target != opts.ignore_index).sum().clamp(min=1)
    return ce_output(
        loss,
        z_loss,
        acc,
        argmax,
        return_z_loss=return_z_loss,
        return_token_accuracy=return_token_accuracy,
        return_predicted_tokens=return_predicted_tokens,
    )
