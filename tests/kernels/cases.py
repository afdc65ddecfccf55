"""Shared pieces of the per-op kernel tests: the backend / device / dtype axes, plain autograd references, the
relative-error-vs-float64 check of the CUDA tests (and its report), and the package internals the tests reach
into (imported here only, so a moved module is renamed in one place)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.ce import reference as ce_ref
from liger_registry.kernels.ce import triton_kernels as ce_triton
from liger_registry.kernels.ce.triton_kernels import ce_rows_triton
from liger_registry.kernels.flce import op as flce_op
from liger_registry.kernels.flce import plan as flce_plan
from liger_registry.kernels.flce import reference as flce_ref
from liger_registry.kernels.flce import triton_kernels as flce_triton
from liger_registry.kernels.flce import vocab as flce_vocab
from liger_registry.kernels.flce.options import FlceOptions
from liger_registry.kernels.flce.target import target_logits_torch, target_logits_triton
from liger_registry.kernels.glu import reference as glu_math
from liger_registry.kernels.glu import triton_kernels as glu_kernels
from liger_registry.kernels.jsd.reference import jsd_rows_differentiable
from liger_registry.kernels.loss_grads import _scale_unless_one_kernel, scale_unless_one_
from liger_registry.kernels.moe import op as moe_ops
from liger_registry.kernels.moe import triton_kernels as moe_kernels
from liger_registry.kernels.moe import tuning as moe_tuning
from liger_registry.kernels.moe.routing import route as moe_route
from liger_registry.kernels.norm import reference as norm_math
from liger_registry.kernels.norm import triton_kernels as norm_kernels
from liger_registry.kernels.rotary import rope_torch, rope_variant_torch

__all__ = [
    "FlceOptions",
    "ce_rows_triton",
    "ce_ref",
    "flce_op",
    "flce_plan",
    "flce_triton",
    "flce_vocab",
    "flce_ref",
    "glu_kernels",
    "glu_math",
    "jsd_rows_differentiable",
    "moe_kernels",
    "moe_ops",
    "moe_tuning",
    "moe_route",
    "norm_kernels",
    "norm_math",
    "rope_torch",
    "rope_variant_torch",
    "scale_unless_one_",
    "_scale_unless_one_kernel",
    "target_logits_torch",
    "target_logits_triton",
    "ce_triton",
    "triton_utils",
]

# ---------------------------------------------------------------- the axes
HAS_CUDA = torch.cuda.is_available()
INTERPRETER = triton_utils.INTERPRET_AT_IMPORT
NO_INTERPRETER = "CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import"
# the CUDA tests: one marker (the GPU runner selects them with -m gpu) and a skip where there is no device
GPU = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
needs_interpreter = pytest.mark.skipif(not INTERPRETER, reason=NO_INTERPRETER)
BACKENDS = ["torch", pytest.param("triton", marks=needs_interpreter)]
# CPU params: fp32 and fp16 (the interpreter has no bf16 tl.dot, and its bf16 casts may round differently);
# bf16 is checked on the torch backend on CPU and by the CUDA tests
CPU_DTYPES = [torch.float32, torch.float16]
GPU_DTYPES = [torch.float32, torch.bfloat16]


def gpu(fn):
    """Marks a CUDA test: ``gpu`` and skipped without a CUDA device."""
    for mark in reversed(GPU):
        fn = mark(fn)
    return fn


def g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def cuda_g(seed: int = 0) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def close(a, b, tol):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def leaf(t, dtype):
    return t.detach().to(dtype).requires_grad_()


def grads(out, ins, go):
    return torch.autograd.grad(out, [i for i in ins if i is not None], go)


# ---------------------------------------------------------------- the CUDA tests' float64 check and report
# bounds on ||out-ref||/||ref||: fp32 arithmetic (no tf32) and bf16 operands
TOL64 = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
ROWS: list[dict] = []


def rel_err(out, ref) -> float:
    out64, ref64 = out.detach().double(), ref.detach().double()
    den = ref64.norm().item()
    return (out64 - ref64).norm().item() / (den if den > 0 else 1.0)


def record(case, name, dtype, err, bound, *, quiet=False) -> dict:
    """One row of the report: printed, and (with $GPU_TEST_REPORT set) the whole report rewritten as we go, so a
    run cut short still leaves its rows."""
    row = {
        "case": case,
        "tensor": name,
        "dtype": str(dtype).replace("torch.", ""),
        "err": err,
        "tol": bound,
        "ok": err <= bound,
    }
    ROWS.append(row)
    if not quiet:
        print(f"[gpu-check] {case} {name} {row['dtype']} rel_err={err:.2e} bound={bound:.0e}", flush=True)
    write_report()
    return row


def write_report():
    path = os.environ.get("GPU_TEST_REPORT")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if path and worker:  # one file per xdist worker, beside the named one; the GPU runner joins them
        root, ext = os.path.splitext(path)
        path = f"{root}.{worker}{ext}"
    if path and ROWS:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": ROWS}, f, indent=1)


def report_table() -> str:
    width = max(len(r["case"]) for r in ROWS)
    lines = [f"{'case':<{width}}  {'tensor':<8} {'dtype':<9} {'rel err':>10} {'bound':>8}  ok"]
    for r in ROWS:
        lines.append(
            f"{r['case']:<{width}}  {r['tensor']:<8} {r['dtype']:<9} {r['err']:>10.2e} {r['tol']:>8.0e}  "
            f"{'yes' if r['ok'] else 'NO'}"
        )
    worst = {}
    for r in ROWS:
        worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), r["err"])
    lines.append(f"{len(ROWS)} tensors checked, {sum(not r['ok'] for r in ROWS)} over bound; worst: {worst}")
    return "\n".join(lines)


def check64(case, name, out, ref, dtype, tol=None):
    """``||out - ref|| / ||ref||`` within the dtype's bound (or ``tol``), ``ref`` a float64 result."""
    assert torch.isfinite(out.detach().double()).all(), f"{case}/{name}: non-finite values"
    err = rel_err(out, ref)
    bound = tol if tol is not None else TOL64[dtype]
    record(case, name, dtype, err, bound)
    assert err <= bound, f"{case}/{name}: rel err {err:.3e} > {bound:.0e}"


# the variants' check against the families' own functions in float64: tighter bounds than TOL64
TOL_FAMILY = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def finite_rel_err(out, ref) -> float:
    assert torch.isfinite(out.detach().double()).all()
    return rel_err(out, ref)


def cuda_randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, device="cuda", generator=cuda_g(seed)) * scale


def check_family(case, ours, family, masters, dtype, *, n_grad=None):
    """Run ``ours`` on ``dtype`` copies of ``masters`` and ``family`` on float64 copies; compare the outputs
    and the gradients of the first ``n_grad`` inputs (all by default)."""
    n_grad = len(masters) if n_grad is None else n_grad
    a = [m.detach().to(dtype).requires_grad_(i < n_grad) for i, m in enumerate(masters)]
    r = [m.detach().to(dtype).double().requires_grad_(i < n_grad) for i, m in enumerate(masters)]
    out, ref = ours(*a), family(*r)
    out, ref = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    gen = cuda_g(1)
    gos = [torch.randn(o.shape, device="cuda", generator=gen) for o in ref]
    grads = torch.autograd.grad(out, a[:n_grad], [g.to(o.dtype) for g, o in zip(gos, out, strict=True)])
    ref_grads = torch.autograd.grad(ref, r[:n_grad], [g.double() for g in gos])
    for i, (o, e) in enumerate(zip((*out, *grads), (*ref, *ref_grads), strict=True)):
        err = finite_rel_err(o, e)
        bound = TOL_FAMILY[dtype]
        print(
            f"[gpu-variant] {case} tensor{i} {str(dtype)[6:]} rel_err={err:.2e} bound={bound:.0e}", flush=True
        )
        record(case, f"tensor{i}", dtype, err, bound, quiet=True)
        assert err <= bound, f"{case} tensor {i}: {err:.3e}"


# bits of bf16 results against the transformers code they replace: the Triton and CUDA fp32 activations may
# differ in their last fp32 bit, which flips a bf16 rounding now and then (1 ulp); where the rounding happens
# is the same, so the rest is bit-equal (rounding once instead differs on a large fraction of elements)
GLU_MAX_ULPS, GLU_MAX_DIFFERING = 1, 2e-3


def bits_check(case, ours, ref, max_ulps=GLU_MAX_ULPS, max_differing=GLU_MAX_DIFFERING):
    assert ours.dtype == ref.dtype == torch.bfloat16 and ours.shape == ref.shape
    ulps, differing = bits_apart(ours, ref)
    print(f"[gpu-bits] {case} max_ulps={ulps} differing={differing:.2e}", flush=True)
    assert ulps <= max_ulps and differing <= max_differing, f"{case}: {ulps} ulps, {differing:.2e} differ"


def norm_step_replays_in_a_cuda_graph(op):
    """A norm's forward + backward is capturable in a CUDA graph (nothing waits for the GPU) and replays to the
    eager gradients."""
    gen = cuda_g(5)
    x = torch.randn(4096, 4096, device="cuda", generator=gen).bfloat16().requires_grad_()
    w = torch.randn(4096, device="cuda", generator=gen).bfloat16().requires_grad_()
    b = torch.randn(4096, device="cuda", generator=gen).bfloat16().requires_grad_()
    dy = torch.randn(4096, 4096, device="cuda", generator=gen).bfloat16()
    params = (x, w, b) if op == "layer_norm" else (x, w)

    def fwd():
        return K.layer_norm(x, w, b, 1e-5) if op == "layer_norm" else K.rms_norm(x, w, 1e-6)

    fwd().backward(dy)
    eager = [p.grad.clone() for p in params]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for p in params:
            p.grad = None
        fwd().backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fwd().backward(dy)
    graph.replay()
    torch.cuda.synchronize()
    for p, e in zip(params, eager, strict=True):
        torch.testing.assert_close(p.grad, e)


# ---------------------------------------------------------------- inputs shared by several ops
def tied_rows(n_cols: int) -> torch.Tensor:
    """Rows whose max sits in two columns (same lane in two blocks, two lanes of one block, across chunks), a
    row spanning 1e4 between its logits, and a row of equal logits."""
    x = torch.randn(6, n_cols, generator=g(3))
    x[0, [3, 3 + 16]] = 9.0  # one lane, two column blocks of 16
    x[1, [20, 7]] = 9.0  # two lanes, the later lane holds the earlier column
    x[2, [n_cols - 1, 2]] = 9.0
    x[3] = torch.linspace(-1e4, 30.0, n_cols)
    x[4] = 0.5
    x[5, -1] = 40.0  # the max in the masked tail's block
    return x


def expected_fields(logits, target, ignore_index, lse_square_scale):
    z = logits.float()
    valid = target != ignore_index
    pred = torch.where(valid, z.argmax(-1), torch.full_like(target, -1))
    acc = (pred == target)[valid].float().mean()
    _, zl = ce_reference(z, target, ignore_index=ignore_index, lse_square_scale=lse_square_scale)
    return zl, acc, pred


# class weights: torch's division, any sign
WEIGHT_CASES = {
    # weights of the batch's non-ignored targets sum to a negative number: torch divides by it
    "negative-sum": {0: -3.0, 1: 1.0},
    # ... to exactly zero, some non-zero: +-inf (or nan) as torch
    "cancelling": {0: 1.0, 1: -1.0},
    # every non-ignored target weighs zero: 0 / 0
    "all-zero": {0: 0.0, 1: 0.0},
}


def weighted_case(case, v=50):
    """Targets 0 and 1 only (and ignored rows), weights from the case, the other classes weigh 1."""
    t = torch.tensor([0, 1, 0, -100, 1, 0, 1, -100, 0, 1, 0, 1, -100])  # five of each
    w = torch.ones(v)
    for cls, value in WEIGHT_CASES[case].items():
        w[cls] = value
    return t, w


def llama_head(inputs: str, bt: int = 2048, h: int = 4096, v: int = 128256):
    """bf16 Llama-3-shaped head inputs on CUDA: "random" (dense softmax) or "peaked" (hidden leans on the target
    row, loss about 2, as ANCHORS.md's confident inputs)."""
    gen = cuda_g(11)
    weight = torch.randn(v, h, device="cuda", generator=gen) * 0.02
    hidden = torch.randn(bt, h, device="cuda", generator=gen)
    target = torch.randint(0, v, (bt,), device="cuda", generator=gen)
    if inputs == "peaked":
        hidden = hidden + 6.5 * weight[target]
    return hidden.bfloat16(), weight.bfloat16(), target


def rel(out, ref) -> float:
    out64, ref64 = out.detach().double(), ref.detach().double()
    return ((out64 - ref64).norm() / ref64.norm().clamp(min=1e-300)).item()


# ---------------------------------------------------------------- plain autograd references
def flce_reference(
    hidden,
    weight,
    target,
    bias=None,
    *,
    ignore_index=-100,
    label_smoothing=0.0,
    softcap=None,
    logit_scale=1.0,
    lse_square_scale=0.0,
    reduction="mean",
    class_weights=None,
):
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    logits = _at_least_fp32(logits) * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return ce_reference(
        logits,
        target,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale,
        reduction=reduction,
        class_weights=class_weights,
    )


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """fp32 for 16-bit inputs; float64 inputs stay float64 (the references of the float64 checks)."""
    return t if t.dtype == torch.float64 else t.float()


def ce_reference(
    logits,
    target,
    *,
    ignore_index=-100,
    label_smoothing=0.0,
    lse_square_scale=0.0,
    reduction="mean",
    class_weights=None,
):
    logits = _at_least_fp32(logits)
    valid = target != ignore_index
    if valid.any():
        ce = F.cross_entropy(
            logits,
            target,
            weight=None if class_weights is None else class_weights.to(logits.dtype),
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            reduction=reduction,
        )
    else:
        ce = logits.sum() * 0.0 if reduction != "none" else logits.sum(-1) * 0.0
    lse = torch.logsumexp(logits, -1)
    z = torch.where(valid, lse_square_scale * lse * lse, torch.zeros_like(lse))
    if reduction == "none":
        zr = z
    elif reduction == "sum":
        zr = z.sum()
    else:
        zr = z.sum() / valid.sum().clamp(min=1)
    return ce + zr, zr


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place between two fp16 or bf16 tensors (int32; +0 and -0 are
    the same point, and the two neighbours of zero are 2 apart)."""
    if a.dtype != b.dtype or a.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"ulp_distance takes two fp16 or two bf16 tensors, got {a.dtype} and {b.dtype}")

    def ordered(x):
        bits = x.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs()


def bits_apart(ours: torch.Tensor, ref: torch.Tensor) -> tuple[int, float]:
    """(largest ulp distance, fraction of elements whose bits differ) between two fp16/bf16 tensors."""
    d = ulp_distance(ours, ref)
    return int(d.max()) if d.numel() else 0, (d > 0).float().mean().item() if d.numel() else 0.0
