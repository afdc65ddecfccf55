"""Fused linear generalised Jensen-Shannon divergence (distillation), chunked over tokens.

* :func:`fused_linear_jsd` and :class:`FusedLinearJSDFunction`; ``fljsd_compute``: the chunk loop over tokens;
  the custom op ``fljsd_forward`` and the backend Op ``FUSED_LINEAR_JSD``.
* With student log-probs ``X = log_softmax(s / T)`` and teacher log-probs ``Y = log_softmax(t / T)``
  (``Q = exp X``, ``P = exp Y``): ``beta = 0`` is forward KL ``KL(P || Q)``, ``beta = 1`` reverse KL
  ``KL(Q || P)``, otherwise with ``M = beta P + (1 - beta) Q`` the loss is ``beta KL(P || M) + (1 - beta)
  KL(Q || M)``. Summed over the vocabulary, averaged over the non-ignored tokens (all tokens when ``target`` is
  None). Gradients flow to the student only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from liger_registry.constants import IGNORE_INDEX
from liger_registry.limits import check_chunk_mem_const

from ..backend import Op, register
from ..define import define_op
from ..flce.plan import flce_chunk_geometry
from .reference import jsd_rows_torch
from .triton_kernels import jsd_rows_triton


def jsd_rows_for(backend: str):
    """The row kernel for an already decided backend."""
    return jsd_rows_triton if backend == "triton" else jsd_rows_torch


def fljsd_compute(
    sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend
):
    """One pass over token chunks: (mean loss, d loss/d student hidden, d loss/d student weight)."""
    n, h = sh.shape
    v = sw.shape[0]
    valid = torch.ones(n, dtype=torch.bool, device=sh.device) if target is None else target != ignore_index
    n_valid = valid.sum().to(torch.float32)
    scale = torch.where(n_valid > 0, 1.0 / n_valid.clamp(min=1.0), torch.zeros_like(n_valid))
    chunk, nchunks = flce_chunk_geometry(n, max(h, th.shape[1]), v, chunk_mem_const)
    dh = torch.empty(sh.shape, dtype=sh.dtype, device=sh.device) if need_dh else None
    dw = torch.zeros(sw.shape, dtype=sw.dtype, device=sw.device) if need_dw else None
    sw_c = sw if sw.dtype == sh.dtype else sw.to(sh.dtype)
    tw_c = tw if tw.dtype == th.dtype else tw.to(th.dtype)
    rows = jsd_rows_for(backend)
    total = torch.zeros((), dtype=torch.float32, device=sh.device)
    s_buf = t_buf = None
    for i in range(nchunks):
        s, e = i * chunk, min((i + 1) * chunk, n)
        if s_buf is None:
            s_buf = torch.empty((chunk, v), dtype=sh.dtype, device=sh.device)
            t_buf = torch.empty((chunk, v), dtype=th.dtype, device=th.device)
        sb, tb = s_buf[: e - s], t_buf[: e - s]
        torch.mm(sh[s:e], sw_c.t(), out=sb)
        torch.mm(th[s:e], tw_c.t(), out=tb)
        loss_rows = rows(
            sb,
            tb,
            valid[s:e],
            beta=beta,
            temperature=temperature,
            grad_scale=scale,
            compute_grad=need_dh or need_dw,
        )
        total += loss_rows.sum()
        if need_dh:
            torch.mm(sb, sw_c, out=dh[s:e])
        if need_dw:
            if dw.dtype == sb.dtype:
                dw.addmm_(sb.t(), sh[s:e])
            else:
                dw.addmm_(sb.t().to(dw.dtype), sh[s:e].to(dw.dtype))
    return total * scale, dh, dw


def _fljsd_forward_impl(
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
    """(loss, d loss / d student hidden, d loss / d student weight): :func:`loop.fljsd_compute`, absent
    gradients as empty tensors; every output fresh and contiguous."""
    loss, dh, dw = fljsd_compute(
        sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend
    )
    return loss, sh.new_empty(0) if dh is None else dh, sh.new_empty(0) if dw is None else dw


def _fljsd_forward_fake(
    sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend
):
    return (
        sh.new_empty((), dtype=torch.float32),
        torch.empty_like(sh, memory_format=torch.contiguous_format) if need_dh else sh.new_empty(0),
        torch.empty_like(sw, memory_format=torch.contiguous_format) if need_dw else sh.new_empty(0),
    )


# explicit fake: the chunk loop's Python arithmetic on N would specialise a dynamic N; the autograd is
# FusedLinearJSDFunction's (public), so the op defines none
FLJSD_FORWARD = define_op("fljsd_forward", _fljsd_forward_impl, fake=_fljsd_forward_fake)


class JsdRun(NamedTuple):
    """What one fused linear JSD call runs, passed as one argument through the autograd function."""

    beta: float
    temperature: float
    ignore_index: int
    chunk_mem_const: int
    backend: str


class FusedLinearJSDFunction(torch.autograd.Function):
    """``(student_hidden, student_weight, teacher_hidden, teacher_weight, target, run: JsdRun)`` -> scalar loss.
    Gradients computed in forward (custom op ``liger_registry::fljsd_forward``), scaled by grad_output in
    backward."""

    @staticmethod
    def forward(ctx, sh, sw, th, tw, target, run: JsdRun):
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        loss, dh, dw = FLJSD_FORWARD(sh, sw, th, tw, target, *run[:4], need_dh, need_dw, run.backend)
        ctx.flags = (need_dh, need_dw)
        ctx.save_for_backward(dh, dw)
        return loss

    @staticmethod
    def backward(ctx, go):
        dh, dw = ctx.saved_tensors
        need_dh, need_dw = ctx.flags
        dh = dh * go.to(dh.dtype) if need_dh else None
        dw = dw * go.to(dw.dtype) if need_dw else None
        return dh, dw, None, None, None, None


def _jsd_on(backend: str):
    def run(sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const):
        return FusedLinearJSDFunction.apply(
            sh,
            sw,
            th.detach(),
            tw.detach(),
            target,
            JsdRun(beta, temperature, ignore_index, chunk_mem_const, backend),
        )

    return run


FUSED_LINEAR_JSD = register(
    Op("fused_linear_jsd", torch_impl=_jsd_on("torch"), triton_impl=_jsd_on("triton"))
)


def fused_linear_jsd(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    target: torch.Tensor | None = None,
    *,
    jsd_beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = IGNORE_INDEX,
    chunk_mem_const: int = 1,
) -> torch.Tensor:
    """Generalised JSD between student and teacher heads (see the module docstring), chunked over tokens
    with its own ``chunk_mem_const`` (the same formula as FLCE's geometry; an independent knob)."""
    check_chunk_mem_const(chunk_mem_const)
    if not 0.0 <= float(jsd_beta) <= 1.0:
        raise ValueError(f"jsd_beta must be in [0, 1], got {jsd_beta}")
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if (
        student_hidden.dim() != 2
        or teacher_hidden.dim() != 2
        or student_hidden.shape[0] != teacher_hidden.shape[0]
    ):
        raise ValueError(
            f"student_hidden and teacher_hidden must be [N, H*] with the same N; got "
            f"{tuple(student_hidden.shape)} and {tuple(teacher_hidden.shape)}"
        )
    if (
        student_weight.shape[1] != student_hidden.shape[1]
        or teacher_weight.shape[1] != teacher_hidden.shape[1]
    ):
        raise ValueError("weights must be [V, H] matching their hidden states")
    if student_weight.shape[0] != teacher_weight.shape[0]:
        raise ValueError(
            f"student and teacher vocabularies differ: {student_weight.shape[0]} vs {teacher_weight.shape[0]}"
        )
    if target is not None and target.shape != (student_hidden.shape[0],):
        raise ValueError(f"target must be [N]; got {tuple(target.shape)}")
    return FUSED_LINEAR_JSD(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        target,
        float(jsd_beta),
        float(temperature),
        ignore_index,
        chunk_mem_const,
    )
