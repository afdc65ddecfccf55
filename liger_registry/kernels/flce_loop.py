"""The FLCE computation of one call: loss scales, the planned strategy's chunk loop, the reduction of its rows.

Both the autograd function (eager) and the ``liger_registry::flce_forward`` custom op (torch.compile) run it.
"""

from __future__ import annotations

import torch

from . import ce_torch
from .ce_output import predicted_tokens
from .flce_run import FlceRun
from .flce_tokens import token_loop
from .flce_vocab import vocab_loop
from .labels import start_label_check

STRATEGY_LOOPS = {"tokens": token_loop, "vocab": vocab_loop}


def flce_compute(
    hidden, weight, target, bias, class_weights, row_grad, run: FlceRun, need: tuple[bool, bool, bool]
):
    """Returns ``(loss, z_loss, n_correct, argmax, dh, dw, db)``.

    ``loss``/``z_loss`` are reduced (or per token for ``none``); the gradients are those of ``loss`` (times
    ``row_grad`` per token when given), ``None`` where ``need`` (dh, dw, db) says so; ``argmax`` is [N] (-1 on
    ignored rows) or empty.
    """
    opts = run.options
    device = hidden.device
    finish_label_check = None
    if row_grad is None:  # the forward; a recomputing backward (reduction none) reads labels already checked
        target, finish_label_check = start_label_check(target, opts.ignore_index, weight.shape[0])
    ce_scale, z_scale = ce_torch.loss_scales(opts.reduction, target, opts.ignore_index, class_weights)
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
