"""Triton kernels through the interpreter (backend forced to triton) vs the torch path and plain references."""

import pytest
import torch
import torch.nn.functional as F
from kernel_refs import ce_reference, flce_reference

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.ce import reference as ce_torch
from liger_registry.kernels.ce import triton_kernels as ce_kernels
from liger_registry.kernels.ce.triton_kernels import ce_rows_triton
from liger_registry.kernels.flce import plan as flce_planner
from liger_registry.kernels.flce import reference as vr
from liger_registry.kernels.flce.options import FlceOptions
from liger_registry.kernels.flce.target import target_logits_torch, target_logits_triton
from liger_registry.kernels.flce.triton_kernels import grad_inplace_triton, stats_update_triton
from liger_registry.kernels.glu import reference as glu_math
from liger_registry.kernels.norm import reference as norm_math
from liger_registry.kernels.norm import triton_kernels as norm_kernels
from liger_registry.kernels.rotary import rope_torch

STRATEGIES = ["tokens", "vocab"]

pytestmark = pytest.mark.skipif(
    not triton_utils.INTERPRET_AT_IMPORT,
    reason="CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import",
)


@pytest.fixture(autouse=True)
def _triton(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)  # tiny shapes still cross column blocks
    monkeypatch.setattr(flce_planner, "VOCAB_ALIGN", 8)  # and several vocabulary chunks


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _close(a, b, tol):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_backend_is_triton_on_cpu():
    assert K.backend_for(torch.randn(2), op="rms_norm") == "triton"


CE_OPTS = [
    {},
    {"label_smoothing": 0.1},
    {"softcap": 3.0},
    {"logit_scale": 0.5, "lse_square_scale": 1e-2},
    {"class_weights": True, "label_smoothing": 0.2},
]


@pytest.mark.parametrize("opts", CE_OPTS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ce_rows_kernel_matches_torch(opts, dtype):
    x = (torch.randn(9, 50, generator=_g()) * 3).to(dtype)
    t = torch.randint(0, 50, (9,), generator=_g(1))
    t[[2, 5]] = -100
    o = dict(
        ignore_index=-100,
        label_smoothing=0.0,
        softcap=None,
        logit_scale=1.0,
        lse_square_scale=0.0,
        class_weights=None,
        ce_grad_scale=0.3,
        z_grad_scale=0.7,
        row_grad=torch.randn(9, generator=_g(2)),
        compute_grad=True,
    )
    o.update(opts)
    if o["class_weights"] is True:
        o["class_weights"] = torch.rand(50, generator=_g(3)) + 0.5
    b1, b2 = x.clone(), x.clone()
    r1 = ce_torch.ce_rows_torch(b1, t, **o)
    r2 = ce_rows_triton(b2, t, **o)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    _close(r2[0], r1[0], tol)
    _close(r2[1], r1[1], tol)
    assert torch.equal(r2[2], r1[2])
    _close(b2, b1, tol)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"label_smoothing": 0.1, "class_weights": True},
        {"softcap": 2.0, "logit_scale": 0.5, "lse_square_scale": 1e-3},
    ],
    ids=lambda o: "-".join(o) or "plain",
)
def test_flce_triton_matches_reference(opts, reduction, strategy):
    n, h, v = 37, 16, 50
    hidden = torch.randn(n, h, generator=_g()).requires_grad_()
    weight = (torch.randn(v, h, generator=_g(1)) * 0.5).requires_grad_()
    bias = (torch.randn(v, generator=_g(2)) * 0.1).requires_grad_()
    target = torch.randint(0, v, (n,), generator=_g(3))
    target[::4] = -100
    opts = dict(opts)
    if opts.get("class_weights"):
        opts["class_weights"] = torch.rand(v, generator=_g(4)) + 0.5
    out = K.fused_linear_cross_entropy(
        hidden, weight, target, bias, reduction=reduction, strategy=strategy, **opts
    )
    ref, _ = flce_reference(hidden, weight, target, bias, reduction=reduction, **opts)
    _close(out, ref, 1e-5)
    go = torch.randn_like(ref) if reduction == "none" else torch.tensor(0.7)
    got = torch.autograd.grad(out, [hidden, weight, bias], go)
    exp = torch.autograd.grad(ref, [hidden, weight, bias], go)
    for a, e in zip(got, exp, strict=True):
        _close(a, e, 1e-5)
    other = K.fused_linear_cross_entropy(
        hidden, weight, target, bias, reduction=reduction, strategy=STRATEGIES[strategy == "tokens"], **opts
    )
    _close(out, other, 1e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flce_triton_edge_cases(strategy):
    v, h = 50, 16
    weight = (torch.randn(v, h, generator=_g(1)) * 0.5).requires_grad_()
    # BT = 1
    h1 = torch.randn(1, h, generator=_g()).requires_grad_()
    t1 = torch.tensor([7])
    out = K.fused_linear_cross_entropy(
        h1, weight, t1, return_token_accuracy=True, return_predicted_tokens=True
    )
    ref, _ = flce_reference(h1, weight, t1)
    _close(out.loss, ref, 1e-5)
    assert torch.equal(out.predicted_tokens, (h1 @ weight.t()).argmax(-1))
    # non-contiguous hidden
    big = torch.randn(20, 2 * h, generator=_g(5))
    hn = big[:, ::2].detach().requires_grad_()
    assert not hn.is_contiguous()
    t = torch.randint(0, v, (20,), generator=_g(6))
    out = K.fused_linear_cross_entropy(hn, weight, t, strategy=strategy)
    ref, _ = flce_reference(hn, weight, t)
    _close(out, ref, 1e-5)
    _close(torch.autograd.grad(out, hn)[0], torch.autograd.grad(ref, hn)[0], 1e-5)
    # all labels ignored
    hz = torch.randn(9, h, generator=_g(7)).requires_grad_()
    out = K.fused_linear_cross_entropy(hz, weight, torch.full((9,), -100), strategy=strategy)
    out.backward()
    assert out.item() == 0.0 and (hz.grad == 0).all() and (weight.grad == 0).all()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flce_triton_fp16_near_overflow(strategy):
    # logits around +-3e4 in fp16 (max 65504): the kernel must upcast before exp and stay finite
    v, h, n = 50, 16, 12
    weight = torch.randn(v, h, generator=_g(1)).half()
    hidden = (torch.randn(n, h, generator=_g(2)) * 1500).half()
    logits = hidden.float() @ weight.float().t()
    assert logits.abs().max() > 1e4 and logits.abs().max() < 65504
    hidden.requires_grad_()
    weight.requires_grad_()
    t = torch.randint(0, v, (n,), generator=_g(3))
    out = K.fused_linear_cross_entropy(hidden, weight, t, reduction="sum", strategy=strategy)
    ref = F.cross_entropy((hidden @ weight.t()).float(), t, reduction="sum")
    assert torch.isfinite(out)
    _close(out, ref, 2e-3 * ref.abs().item())
    gh, gw = torch.autograd.grad(out, [hidden, weight])
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all()


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cross_entropy_triton(reduction, dtype):
    logits = (torch.randn(11, 50, generator=_g()) * 2).to(dtype).requires_grad_()
    t = torch.randint(0, 50, (11,), generator=_g(1))
    t[3] = -100
    out = K.cross_entropy(logits, t, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3)
    ref, _ = ce_reference(logits, t, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    _close(out, ref, tol)
    go = torch.randn_like(ref)
    _close(torch.autograd.grad(out, logits, go)[0], torch.autograd.grad(ref, logits, go)[0], tol)


@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.5), ("llama", 1.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_triton(mode, offset, dtype):
    x = torch.randn(7, 3, 40, generator=_g()).to(dtype)[:, 1]  # non-contiguous rows, H not a power of 2
    w = (torch.randn(40, generator=_g(1)) * 0.3).to(dtype)
    x.requires_grad_()
    w.requires_grad_()
    y = K.rms_norm(x, w, 1e-6, offset, mode)
    ref = norm_math.rms_norm_torch(x, w, 1e-6, offset, mode)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    if dtype == torch.float32 and mode != "none":
        assert torch.allclose(y, ref, rtol=1e-6, atol=1e-6)
    _close(y, ref, tol)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, w], dy)
    exp = torch.autograd.grad(ref, [x, w], dy)
    for a, e in zip(got, exp, strict=True):
        _close(a, e, tol * 5)


def test_rms_norm_in_place_backward():
    x = torch.randn(6, 24, generator=_g()).requires_grad_()
    w = torch.randn(24, generator=_g(1)).requires_grad_()
    y = K.rms_norm(x, w, 1e-6, in_place_backward=True)
    dy = torch.randn(6, 24, generator=_g(2))
    y.backward(dy.clone())
    ref = norm_math.rms_norm_torch(x, w, 1e-6)
    ex, ew = torch.autograd.grad(ref, [x, w], dy)
    _close(x.grad, ex, 1e-5)
    _close(w.grad, ew, 1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_triton(bias):
    x = torch.randn(9, 40, generator=_g()).requires_grad_()
    w = torch.randn(40, generator=_g(1)).requires_grad_()
    b = torch.randn(40, generator=_g(2)).requires_grad_() if bias else None
    y = K.layer_norm(x, w, b, 1e-5)
    ref = F.layer_norm(x, (40,), w, b, 1e-5)
    _close(y, ref, 1e-5)
    dy = torch.randn_like(y)
    ins = [x, w] + ([b] if bias else [])
    for a, e in zip(torch.autograd.grad(y, ins, dy), torch.autograd.grad(ref, ins, dy), strict=True):
        _close(a, e, 1e-4)


@pytest.mark.parametrize("need", [(True, False), (False, True)], ids=["dw-only", "db-only"])
def test_layer_norm_triton_one_parameter_grad(need):
    """The backward's partials buffer holds only the gradients asked for; the sum kernel writes each one."""
    x = torch.randn(9, 40, generator=_g()).requires_grad_()
    w = torch.randn(40, generator=_g(1)).requires_grad_(need[0])
    b = torch.randn(40, generator=_g(2)).requires_grad_(need[1])
    dy = torch.randn(9, 40, generator=_g(3))
    p = w if need[0] else b
    got = torch.autograd.grad(K.layer_norm(x, w, b, 1e-5), [x, p], dy)
    exp = torch.autograd.grad(F.layer_norm(x, (40,), w, b, 1e-5), [x, p], dy)
    for a, e in zip(got, exp, strict=True):
        _close(a, e, 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_partial_sums_kernel(monkeypatch, dtype):
    """Several partial-row steps and column blocks with a ragged tail; the result is cast to the weight dtype."""
    monkeypatch.setattr(norm_kernels, "SUM_BLOCK_P", 8)
    parts = torch.randn(2, 37, 150, generator=_g())
    dw, db = norm_kernels._sum_parts(parts, dtype)
    assert dw.dtype == db.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2**-7  # one bf16 rounding of the fp32 sum (<= half an ulp)
    _close(dw, parts[0].sum(0), tol)
    _close(db, parts[1].sum(0), tol)
    (only,) = norm_kernels._sum_parts(parts[1:], dtype)
    _close(only, parts[1].sum(0), tol)


@pytest.mark.parametrize("batch_cos", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_triton(batch_cos, dtype):
    b, hq, hk, s, d = 2, 5, 3, 6, 12
    # HF layout through a transpose: q [B, S, H, D] -> [B, H, S, D] (non-contiguous)
    q = torch.randn(b, s, hq, d, generator=_g()).to(dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, hk, d, generator=_g(1)).to(dtype).transpose(1, 2).requires_grad_()
    ang = torch.randn(batch_cos, s, d // 2, generator=_g(2))
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    qo, ko = K.rope(q, k, cos, sin)
    qr, kr = rope_torch(q, k, cos, sin)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    _close(qo, qr, tol)
    _close(ko, kr, tol)
    gq, gk = torch.randn_like(qr), torch.randn_like(kr)
    got = torch.autograd.grad((qo, ko), [q, k], (gq, gk))
    exp = torch.autograd.grad((qr, kr), [q, k], (gq, gk))
    for a, e in zip(got, exp, strict=True):
        _close(a, e, tol)


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_glu_triton(name, dtype):
    a = (torch.randn(3, 1500, generator=_g()) * 3).to(dtype).requires_grad_()  # 4500 = not a multiple of 1024
    b = torch.randn(3, 1500, generator=_g(1)).to(dtype).requires_grad_()
    torch_fn = getattr(glu_math, f"{name}_torch")
    y, ref = getattr(K, name)(a, b), torch_fn(a, b)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    _close(y, ref, tol)
    dy = torch.randn_like(y)
    for x, e in zip(torch.autograd.grad(y, [a, b], dy), torch.autograd.grad(ref, [a, b], dy), strict=True):
        _close(x, e, tol * 2)


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_glu_in_place_backward_writes_the_gradients_over_gate_and_up(name):
    x = torch.randn(4, 40, generator=_g()).requires_grad_()
    w_gate, w_up = torch.randn(40, 40, generator=_g(1)), torch.randn(40, 40, generator=_g(2))
    gate, up = x @ w_gate, x @ w_up  # an MLP's projections: made for the kernel alone
    before = gate.detach().clone(), up.detach().clone()
    y = getattr(K, name)(gate, up, gate_multiplier=0.5, in_place_backward=True)
    dy = torch.randn(y.shape, generator=_g(3))
    got = torch.autograd.grad(y, [gate, up], dy, retain_graph=True)
    ref_gate, ref_up = (t.clone().requires_grad_() for t in before)
    ref = getattr(glu_math, f"{name}_torch")(ref_gate, ref_up, 0.5)
    want = torch.autograd.grad(ref, [ref_gate, ref_up], dy)
    for a, e in zip(got, want, strict=True):
        _close(a, e, 1e-5)
    assert got[0].data_ptr() == gate.data_ptr() and got[1].data_ptr() == up.data_ptr()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, [gate, up], dy)  # the saved activations are gone: a second backward refuses


def test_glu_in_place_backward_never_writes_over_a_leaf():
    gate = torch.randn(4, 40, generator=_g()).requires_grad_()
    up = torch.randn(4, 40, generator=_g(1)).requires_grad_()
    before = gate.detach().clone(), up.detach().clone()
    y = K.swiglu(gate, up, in_place_backward=True)
    dy = torch.randn(y.shape, generator=_g(2))
    y.backward(dy)
    assert torch.equal(gate.detach(), before[0]) and torch.equal(up.detach(), before[1])
    ref = [t.clone().requires_grad_() for t in before]
    want = torch.autograd.grad(glu_math.swiglu_torch(*ref), ref, dy)
    _close(gate.grad, want[0], 1e-5)
    _close(up.grad, want[1], 1e-5)


@pytest.mark.parametrize("layout", ["same tensor", "strided halves"])
def test_glu_in_place_backward_of_shared_or_strided_inputs_is_out_of_place(layout):
    x = torch.randn(4, 80, generator=_g()).requires_grad_()
    proj = x * 2.0  # the kernel's inputs are made from it
    gate, up = (proj, proj) if layout == "same tensor" else (proj[:, :40], proj[:, 40:])
    y = K.swiglu(gate, up, in_place_backward=True)
    dy = torch.randn(y.shape, generator=_g(1))
    got = torch.autograd.grad(y, [x], dy)[0]
    ref_x = x.detach().clone().requires_grad_()
    ref_proj = ref_x * 2.0
    ref_gate, ref_up = (
        (ref_proj, ref_proj) if layout == "same tensor" else (ref_proj[:, :40], ref_proj[:, 40:])
    )
    want = torch.autograd.grad(glu_math.swiglu_torch(ref_gate, ref_up), [ref_x], dy)[0]
    _close(got, want, 1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd_triton(beta, monkeypatch):
    n, h, v = 21, 16, 50
    sh = torch.randn(n, h, generator=_g()).requires_grad_()
    sw = (torch.randn(v, h, generator=_g(1)) * 0.5).requires_grad_()
    th, tw = torch.randn(n, h, generator=_g(2)), torch.randn(v, h, generator=_g(3)) * 0.5
    target = torch.randint(0, v, (n,), generator=_g(4))
    target[::3] = -100
    loss = K.fused_linear_jsd(sh, sw, th, tw, target, jsd_beta=beta, temperature=1.5)
    monkeypatch.setenv(K.ENV_VAR, "torch")
    ref = K.fused_linear_jsd(sh, sw, th, tw, target, jsd_beta=beta, temperature=1.5)
    _close(loss, ref, 1e-5)
    for a, e in zip(torch.autograd.grad(loss, [sh, sw]), torch.autograd.grad(ref, [sh, sw]), strict=True):
        _close(a, e, 1e-5)


def test_forced_triton_refuses_with_reasons():
    with pytest.raises(K.BackendError, match="dtype float64 not supported"):
        K.swiglu(torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))


def test_rope_one_output_unused():
    q = torch.randn(1, 2, 4, 8, generator=_g()).requires_grad_()
    k = torch.randn(1, 1, 4, 8, generator=_g(1)).requires_grad_()
    ang = torch.randn(1, 4, 8, generator=_g(2))
    qo, _ = K.rope(q, k, ang.cos(), ang.sin())
    qo.sum().backward()
    qr, _ = rope_torch(q, k, ang.cos(), ang.sin())
    (eq,) = torch.autograd.grad(qr.sum(), q)
    _close(q.grad, eq, 1e-5)
    assert k.grad is None or not k.grad.any()


VOCAB_OPTS = [
    {},
    {"label_smoothing": 0.1},
    {"label_smoothing": 0.2, "class_weights": True},
    {"softcap": 3.0, "logit_scale": 0.5},
]


@pytest.mark.parametrize("opts", VOCAB_OPTS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_vocab_row_kernels_match_torch(opts, dtype):
    n, v, w0 = 11, 45, 13  # chunks of 13 columns at offsets 0, 13, 26, 39 (last one 6 wide), blocks of 16
    x = (torch.randn(n, v, generator=_g()) * 3).to(dtype)
    t = torch.randint(0, v, (n,), generator=_g(1))
    t[[2, 7]] = -100
    opts = dict(opts)
    cw = torch.rand(v, generator=_g(3)) + 0.5 if opts.pop("class_weights", False) else None
    o = FlceOptions(**opts)
    states = [vr.new_state(n, "cpu"), vr.new_state(n, "cpu")]
    for s in range(0, v, w0):
        chunk = x[:, s : s + w0].contiguous()
        vr.stats_update_torch(chunk, s, t, states[0], opts=o, class_weights=cw, argmax=True)
        stats_update_triton(chunk, s, t, states[1], opts=o, class_weights=cw, argmax=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for a, b in zip(states[1], states[0], strict=True):
        _close(a, b, tol)
    assert torch.equal(states[1].best_i, ce_torch.transform_logits(x, o.softcap, o.logit_scale).argmax(-1))
    kw = dict(ce_scale=0.3, z_scale=0.7, row_grad=torch.randn(n, generator=_g(2)), opts=o, class_weights=cw)
    ce, _, coefs = vr.row_losses(states[0], t, v, **kw)
    ref_rows = ce_torch.ce_rows_torch(
        x.clone(),
        t,
        ignore_index=-100,
        label_smoothing=o.label_smoothing,
        softcap=o.softcap,
        logit_scale=o.logit_scale,
        lse_square_scale=0.0,
        class_weights=cw,
        ce_grad_scale=0.3,
        z_grad_scale=0.7,
        row_grad=kw["row_grad"],
        compute_grad=False,
    )
    _close(ce, ref_rows[0], tol)
    grad_ref = x.clone()
    ce_torch.ce_rows_torch(
        grad_ref,
        t,
        ignore_index=-100,
        label_smoothing=o.label_smoothing,
        softcap=o.softcap,
        logit_scale=o.logit_scale,
        lse_square_scale=0.0,
        class_weights=cw,
        ce_grad_scale=0.3,
        z_grad_scale=0.7,
        row_grad=kw["row_grad"],
        compute_grad=True,
    )
    for s in range(0, v, w0):
        a, b = x[:, s : s + w0].contiguous(), x[:, s : s + w0].contiguous()
        vr.grad_inplace_torch(a, s, t, coefs, opts=o, class_weights=cw)
        grad_inplace_triton(b, s, t, coefs, opts=o, class_weights=cw)
        _close(b, a, tol)
        _close(a, grad_ref[:, s : s + w0], tol)


@pytest.mark.parametrize(
    "opts", [{}, {"softcap": 3.0, "logit_scale": 0.5}], ids=lambda o: "-".join(o) or "plain"
)
@pytest.mark.parametrize("bias", [False, True])
def test_target_logit_kernel_matches_torch(opts, bias):
    n, h, v = 13, 40, 50  # H not a power of two
    hidden = torch.randn(n, h, generator=_g()).half()
    weight = torch.randn(v, h, generator=_g(1)).half()
    b = torch.randn(v, generator=_g(2)) if bias else None
    t = torch.randint(0, v, (n,), generator=_g(3))
    t[[1, 6]] = -100
    kw = dict(ignore_index=-100, softcap=opts.get("softcap"), logit_scale=opts.get("logit_scale", 1.0))
    got = target_logits_triton(hidden, weight, t, b, **kw)
    exp = target_logits_torch(hidden, weight, t, b, **kw)
    _close(got, exp, 1e-6)
    raw = (hidden.double() @ weight.double().t()).gather(1, t.clamp(min=0)[:, None]).squeeze(1)
    raw = raw + (b.double()[t.clamp(min=0)] if bias else 0.0)
    _close(exp, ce_torch.transform_logits(raw, kw["softcap"], kw["logit_scale"]), 1e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flce_triton_exact_target_logit_matches_torch(strategy, monkeypatch):
    """16-bit inputs: the Triton path (row kernels with the exact target logit) = the PyTorch path."""
    n, h, v = 21, 40, 50
    g = _g(5)
    weight = torch.randn(v, h, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    hidden = (torch.randn(n, h, generator=g) + 1.5 * weight[t]).half()
    weight = weight.half()
    t[[2, 9]] = -100
    out = K.fused_linear_cross_entropy(hidden, weight, t, strategy=strategy, softcap=20.0)
    monkeypatch.setenv(K.ENV_VAR, "torch")
    ref = K.fused_linear_cross_entropy(hidden, weight, t, strategy=strategy, softcap=20.0)
    _close(out, ref, 1e-6)


def _tied_rows(n_cols: int) -> torch.Tensor:
    """Rows whose max sits in two columns (same lane in two blocks, two lanes of one block, across chunks), a
    row spanning 1e4 between its logits, and a row of equal logits."""
    x = torch.randn(6, n_cols, generator=_g(3))
    x[0, [3, 3 + 16]] = 9.0  # one lane, two column blocks of 16
    x[1, [20, 7]] = 9.0  # two lanes, the later lane holds the earlier column
    x[2, [n_cols - 1, 2]] = 9.0
    x[3] = torch.linspace(-1e4, 30.0, n_cols)
    x[4] = 0.5
    x[5, -1] = 40.0  # the max in the masked tail's block
    return x


STATS_MODES = ["lanes", "blocks"]


@pytest.mark.parametrize("mode", STATS_MODES)
@pytest.mark.parametrize("n_cols", [37, 48])
def test_ce_rows_stats_lse_and_first_argmax(n_cols, mode, monkeypatch):
    """Both statistics passes (per-lane state, block reductions) give torch's logsumexp and torch.argmax's first
    index on ties."""
    monkeypatch.setitem(ce_kernels.ROW_STATS, "ce_rows", (mode, 16))
    x = _tied_rows(n_cols)
    t = torch.zeros(x.shape[0], dtype=torch.long)
    o = dict(ignore_index=-100, label_smoothing=0.0, softcap=None, logit_scale=1.0, lse_square_scale=1.0)
    kw = dict(class_weights=None, ce_grad_scale=1.0, z_grad_scale=1.0, row_grad=None, compute_grad=False)
    ce, z, am = ce_rows_triton(x.clone(), t, **o, **kw, argmax_mode=2)
    lse = torch.logsumexp(x.double(), -1)
    torch.testing.assert_close(ce.double(), lse - x[:, 0].double(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(z.double(), lse * lse, rtol=1e-6, atol=1e-3)
    assert torch.equal(am, x.argmax(-1))


@pytest.mark.parametrize("mode", STATS_MODES)
def test_vocab_stats_across_chunks_first_argmax(mode, monkeypatch):
    """Chunked statistics merge into the row state: logsumexp of the whole row, first argmax across chunks."""
    from liger_registry.kernels.flce import triton_kernels as triton_flce_vocab

    monkeypatch.setitem(ce_kernels.ROW_STATS, "vocab_stats", (mode, 16))
    triton_flce_vocab._flags.cache_clear()
    x = _tied_rows(50)
    x[0, [5, 45]] = 11.0  # the tie spans two vocabulary chunks
    t = torch.zeros(x.shape[0], dtype=torch.long)
    o = FlceOptions()
    state = vr.new_state(x.shape[0], x.device)
    for s in range(0, 50, 20):
        stats_update_triton(
            x[:, s : s + 20].contiguous(), s, t, state, opts=o, class_weights=None, argmax=True
        )
    lse = torch.logsumexp(x.double(), -1)
    torch.testing.assert_close(state.m.double() + state.d.double().log(), lse, rtol=1e-6, atol=1e-5)
    assert torch.equal(state.best_i, x.argmax(-1))
