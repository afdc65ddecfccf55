"""Fused linear cross entropy: loss of ``softcap((hidden @ W.T + b) * scale)`` without materialising the logits."""

from __future__ import annotations

from dataclasses import replace

import torch

from .backward_once import check_backward
from .ce_output import CrossEntropyOutput, argmax_mode_for, ce_output
from .custom_ops_loss import flce_run_forward, flce_scale_grads
from .flce_options import FlceOptions, options_from
from .flce_planner import FlcePlan, plan_for
from .flce_run import FlceRun
from .op import Op, register

FLCEOutput = CrossEntropyOutput  # the name this output had before cross_entropy returned it too


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd Function of FLCE: ``(hidden, weight, target, bias, class_weights, run: FlceRun)`` ->
    ``(loss, z_loss, n_correct, argmax)``.

    For ``mean``/``sum`` the forward computes the gradients chunk by chunk and the backward only scales them by
    ``grad_output`` (in place: a second backward works only with grad_output 1, else a clear error saying which
    option to use); for ``none`` the forward keeps the inputs and the backward recomputes with the per-token ``grad_output`` (the only exact way without storing [N, V]). Under
    torch.compile the work happens in ``torch.ops.liger_registry.flce_forward``, one opaque custom op.
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
            flce_scale_grads(dh, dw, db, grad_loss)
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


def _check_shapes(hidden, weight, target, bias, class_weights) -> None:
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
    _check_shapes(hidden, weight, target, bias, class_weights)
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
