"""GPU checks of the Triton kernels (skipped without CUDA): bf16 and fp32 against float64 references.

Error per tensor: ||out - ref|| / ||ref||. Run on a CUDA machine:
    LIGER_REGISTRY_BACKEND=auto python -m pytest -q -s tests/kernels/test_gpu.py
The summary table is printed at the end (and written as JSON to $GPU_TEST_REPORT when set).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from kernel_refs import bits_apart
from transformers.activations import ACT2FN
from transformers.models.gemma import modeling_gemma
from transformers.models.gemma.configuration_gemma import GemmaConfig
from transformers.models.llama import modeling_llama
from transformers.models.llama.configuration_llama import LlamaConfig

from liger_registry import kernels as K
from liger_registry.kernels.glu import reference as glu_math
from liger_registry.kernels.rotary import rope_torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# bounds on ||out-ref||/||ref||: fp32 arithmetic (no tf32) and bf16 operands
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
ROWS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if not ROWS:
        return
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
    print("\n" + "\n".join(lines))
    path = os.environ.get("GPU_TEST_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": ROWS}, f, indent=1)


def _check(case, name, out, ref, dtype, tol=None):
    out64, ref64 = out.detach().double(), ref.detach().double()
    assert torch.isfinite(out64).all(), f"{case}/{name}: non-finite values"
    den = ref64.norm().item()
    err = (out64 - ref64).norm().item() / (den if den > 0 else 1.0)
    bound = tol if tol is not None else TOL[dtype]
    ROWS.append(
        {
            "case": case,
            "tensor": name,
            "dtype": str(dtype).replace("torch.", ""),
            "err": err,
            "tol": bound,
            "ok": err <= bound,
        }
    )
    print(f"[gpu-check] {case} {name} {ROWS[-1]['dtype']} rel_err={err:.2e} bound={bound:.0e}", flush=True)
    path = os.environ.get("GPU_TEST_REPORT")
    if path:  # written as we go, so a run cut short still leaves its rows
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": ROWS}, f, indent=1)
    assert err <= bound, f"{case}/{name}: rel err {err:.3e} > {bound:.0e}"


def _leaf(t, dtype):
    return t.detach().to(dtype).requires_grad_()


def _grads(out, ins, go):
    return torch.autograd.grad(out, [i for i in ins if i is not None], go)


DTYPES = [torch.float32, torch.bfloat16]


def test_auto_backend_is_triton_on_cuda(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "auto")
    x = torch.randn(4, 8, device="cuda")
    assert K.backend_for(x, op="rms_norm") == "triton"
    assert K.backend_for(x.double(), op="rms_norm") == "torch"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"label_smoothing": 0.1, "softcap": 15.0, "lse_square_scale": 1e-4},
        {"bias": True, "class_weights": True, "logit_scale": 0.5},
        {"reduction": "none"},
        {"chunk_mem_const": 8, "reduction": "sum"},
    ],
    ids=lambda o: "-".join(o) or "plain",
)
@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
def test_flce(dtype, opts, strategy):
    g = torch.Generator(device="cuda").manual_seed(0)
    n, h, v = 2051, 1024, 32007
    opts = dict(opts)
    hidden = torch.randn(n, h, device="cuda", generator=g)
    weight = torch.randn(v, h, device="cuda", generator=g) * 0.05
    target = torch.randint(0, v, (n,), device="cuda", generator=g)
    target[::7] = -100
    bias = torch.randn(v, device="cuda", generator=g) * 0.1 if opts.pop("bias", False) else None
    if opts.pop("class_weights", False):
        opts["class_weights"] = torch.rand(v, device="cuda", generator=g) + 0.5
    red = opts.get("reduction", "mean")
    go = torch.randn(n, device="cuda", generator=g) if red == "none" else torch.tensor(1.3, device="cuda")
    ins = [_leaf(hidden, dtype), _leaf(weight, dtype), None if bias is None else _leaf(bias, dtype)]
    out = K.fused_linear_cross_entropy(ins[0], ins[1], target, ins[2], strategy=strategy, **opts)
    ref_in = [_leaf(t.to(dtype), torch.float64) if t is not None else None for t in (hidden, weight, bias)]
    ref_opts = {
        k: (val.double() if isinstance(val, torch.Tensor) else val)
        for k, val in opts.items()
        if k != "chunk_mem_const"
    }
    ref = _flce_ref64(ref_in[0], ref_in[1], target, ref_in[2], **ref_opts)
    case = f"flce {strategy} " + ("-".join(f"{k}" for k in opts) or "plain")
    _check(case, "loss", out, ref, dtype)
    names = ["d_hidden", "d_weight", "d_bias"]
    for name, a, e in zip(
        names, _grads(out, ins, go.to(out.dtype)), _grads(ref, ref_in, go.double()), strict=False
    ):
        _check(case, name, a, e, dtype)


def _flce_ref64(
    hidden,
    weight,
    target,
    bias=None,
    *,
    label_smoothing=0.0,
    softcap=None,
    logit_scale=1.0,
    lse_square_scale=0.0,
    reduction="mean",
    class_weights=None,
):
    z = hidden @ weight.t()
    if bias is not None:
        z = z + bias
    z = z * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    valid = target != -100
    ce = F.cross_entropy(
        z, target, weight=class_weights, label_smoothing=label_smoothing, reduction=reduction
    )
    lse = torch.logsumexp(z, -1)
    zl = torch.where(valid, lse_square_scale * lse * lse, torch.zeros_like(lse))
    if reduction == "none":
        return ce + zl
    if reduction == "sum":
        return ce + zl.sum()
    return ce + zl.sum() / valid.sum()


def _token_scaled_ref64(hidden, weight, target, *, label_smoothing=0.0, softcap=None, lse_square_scale=0.0):
    """Per-token loss times the detached target probability, mean over non-ignored tokens (float64)."""
    z = hidden @ weight.t()
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    valid = target != -100
    safe = torch.where(valid, target, torch.zeros_like(target))
    ce = F.cross_entropy(z, safe, label_smoothing=label_smoothing, reduction="none")
    lse = torch.logsumexp(z, -1)
    p = torch.softmax(z, -1).gather(1, safe[:, None]).squeeze(1).detach()
    rows = torch.where(valid, (ce + lse_square_scale * lse * lse) * p, torch.zeros_like(ce))
    return rows.sum() / valid.sum()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
def test_flce_token_scaling(dtype, strategy):
    g = torch.Generator(device="cuda").manual_seed(0)
    n, h, v = 2051, 1024, 32007
    hidden = torch.randn(n, h, device="cuda", generator=g)
    weight = torch.randn(v, h, device="cuda", generator=g) * 0.05
    target = torch.randint(0, v, (n,), device="cuda", generator=g)
    target[::7] = -100
    opts = {"label_smoothing": 0.1, "softcap": 15.0, "lse_square_scale": 1e-4}
    ins = [_leaf(hidden, dtype), _leaf(weight, dtype)]
    out = K.fused_linear_cross_entropy(
        *ins, target, strategy=strategy, use_token_scaling=True, accum_dtype=torch.float32, **opts
    )
    ref_in = [_leaf(t.to(dtype), torch.float64) for t in (hidden, weight)]
    ref = _token_scaled_ref64(*ref_in, target, **opts)
    case = f"flce {strategy} token_scaling"
    _check(case, "loss", out, ref, dtype)
    go = torch.tensor(1.3, device="cuda")
    for name, a, e in zip(
        ["d_hidden", "d_weight"], _grads(out, ins, go), _grads(ref, ref_in, go.double()), strict=True
    ):
        _check(case, name, a, e, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
def test_flce_edges(dtype, strategy):
    g = torch.Generator(device="cuda").manual_seed(1)
    v, h = 50257, 512
    weight = _leaf(torch.randn(v, h, device="cuda", generator=g) * 0.05, dtype)
    # BT = 1
    h1 = _leaf(torch.randn(1, h, device="cuda", generator=g), dtype)
    t1 = torch.tensor([123], device="cuda")
    out = K.fused_linear_cross_entropy(h1, weight, t1, strategy=strategy)
    w64, h64 = _leaf(weight, torch.float64), _leaf(h1, torch.float64)
    ref = F.cross_entropy(h64 @ w64.t(), t1)
    _check("flce bt=1", "loss", out, ref, dtype)
    for name, a, e in zip(
        ["d_hidden", "d_weight"], _grads(out, [h1, weight], None), _grads(ref, [h64, w64], None), strict=True
    ):
        _check("flce bt=1", name, a, e, dtype)
    # all ignored: exact zeros
    hz = _leaf(torch.randn(300, h, device="cuda", generator=g), dtype)
    out = K.fused_linear_cross_entropy(hz, weight, torch.full((300,), -100, device="cuda"), strategy=strategy)
    dh, dw = torch.autograd.grad(out, [hz, weight])
    assert out.item() == 0.0 and not dh.any() and not dw.any()
    # non-contiguous hidden
    big = torch.randn(400, 2 * h, device="cuda", generator=g)
    hn = big[:, ::2].to(dtype).detach().requires_grad_()
    t = torch.randint(0, v, (400,), device="cuda", generator=g)
    out = K.fused_linear_cross_entropy(hn, weight, t, return_predicted_tokens=True, strategy=strategy)
    hn64 = _leaf(hn, torch.float64)
    ref = F.cross_entropy(hn64 @ w64.t(), t)
    _check("flce non-contiguous", "loss", out.loss, ref, dtype)
    _check(
        "flce non-contiguous",
        "d_hidden",
        _grads(out.loss, [hn], None)[0],
        _grads(ref, [hn64], None)[0],
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cross_entropy(dtype):
    g = torch.Generator(device="cuda").manual_seed(2)
    logits = torch.randn(1031, 50257, device="cuda", generator=g) * 3
    t = torch.randint(0, 50257, (1031,), device="cuda", generator=g)
    t[::5] = -100
    x = _leaf(logits, dtype)
    out = K.cross_entropy(x, t, label_smoothing=0.05, lse_square_scale=1e-4)
    x64 = _leaf(logits.to(dtype), torch.float64)
    lse = torch.logsumexp(x64, -1)
    valid = t != -100
    ref = F.cross_entropy(x64, t, label_smoothing=0.05) + (1e-4 * lse * lse)[valid].mean()
    _check("cross_entropy", "loss", out, ref, dtype)
    _check("cross_entropy", "d_logits", _grads(out, [x], None)[0], _grads(ref, [x64], None)[0], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cross_entropy_inplace_backward(dtype):
    """The opt-in in-place backward: the default's loss and gradient, the gradient left in the logits' storage."""
    g = torch.Generator(device="cuda").manual_seed(2)
    logits = torch.randn(1031, 50257, device="cuda", generator=g) * 3
    t = torch.randint(0, 50257, (1031,), device="cuda", generator=g)
    t[::5] = -100
    x, y = _leaf(logits, dtype), _leaf(logits, dtype)
    ref = K.cross_entropy(x, t, label_smoothing=0.05)
    out = K.cross_entropy(y, t, label_smoothing=0.05, inplace_backward=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    (ref * 0.5).backward()
    (out * 0.5).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=0, atol=0)
    assert y.grad.data_ptr() == y.data_ptr()


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_step_has_no_host_sync(op):
    """A norm's forward + backward is capturable in a CUDA graph (nothing waits for the GPU) and replays to the
    eager gradients."""
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(4096, 4096, device="cuda", generator=g).bfloat16().requires_grad_()
    w = torch.randn(4096, device="cuda", generator=g).bfloat16().requires_grad_()
    b = torch.randn(4096, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(4096, 4096, device="cuda", generator=g).bfloat16()
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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)])
def test_rms_norm(dtype, mode, offset):
    g = torch.Generator(device="cuda").manual_seed(3)
    x0 = torch.randn(4099, 4096, device="cuda", generator=g)
    w0 = torch.randn(4096, device="cuda", generator=g) * 0.1 + (0.0 if offset else 1.0)
    x, w = _leaf(x0, dtype), _leaf(w0, dtype)
    y = K.rms_norm(x, w, 1e-6, offset, mode)
    x64, w64 = _leaf(x0.to(dtype), torch.float64), _leaf(w0.to(dtype), torch.float64)
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + w64)
    case = f"rms_norm {mode}"
    _check(case, "y", y, ref, dtype)
    dy = torch.randn_like(x0)
    for name, a, e in zip(
        ["dx", "dw"], _grads(y, [x, w], dy.to(y.dtype)), _grads(ref, [x64, w64], dy.double()), strict=True
    ):
        _check(case, name, a, e, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm(dtype):
    g = torch.Generator(device="cuda").manual_seed(4)
    x0 = torch.randn(4099, 3000, device="cuda", generator=g) + 0.5
    w0, b0 = torch.randn(3000, device="cuda", generator=g), torch.randn(3000, device="cuda", generator=g)
    x, w, b = _leaf(x0, dtype), _leaf(w0, dtype), _leaf(b0, dtype)
    y = K.layer_norm(x, w, b, 1e-5)
    x64, w64, b64 = (_leaf(t.to(dtype), torch.float64) for t in (x0, w0, b0))
    ref = F.layer_norm(x64, (3000,), w64, b64, 1e-5)
    _check("layer_norm", "y", y, ref, dtype)
    dy = torch.randn_like(x0)
    for name, a, e in zip(
        ["dx", "dw", "db"],
        _grads(y, [x, w, b], dy.to(dtype)),
        _grads(ref, [x64, w64, b64], dy.double()),
        strict=True,
    ):
        _check("layer_norm", name, a, e, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope(dtype):
    g = torch.Generator(device="cuda").manual_seed(5)
    b, hq, hk, s, d = 2, 32, 8, 1000, 128
    q0 = torch.randn(b, s, hq, d, device="cuda", generator=g)
    k0 = torch.randn(b, s, hk, d, device="cuda", generator=g)
    ang = torch.randn(1, s, d // 2, device="cuda", generator=g) * 10
    ang = torch.cat([ang, ang], -1)
    q = q0.to(dtype).transpose(1, 2).requires_grad_()
    k = k0.to(dtype).transpose(1, 2).requires_grad_()
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    qo, ko = K.rope(q, k, cos, sin)
    q64, k64 = _leaf(q, torch.float64), _leaf(k, torch.float64)
    qr, kr = rope_torch(q64, k64, cos.double(), sin.double())
    _check("rope", "q", qo, qr, dtype)
    _check("rope", "k", ko, kr, dtype)
    gq, gk = torch.randn_like(qr), torch.randn_like(kr)
    got = torch.autograd.grad((qo, ko), [q, k], (gq.to(dtype), gk.to(dtype)))
    exp = torch.autograd.grad((qr, kr), [q64, k64], (gq, gk))
    _check("rope", "dq", got[0], exp[0], dtype)
    _check("rope", "dk", got[1], exp[1], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_glu(dtype, name):
    g = torch.Generator(device="cuda").manual_seed(6)
    a0 = torch.randn(1025, 14336, device="cuda", generator=g) * 2
    b0 = torch.randn(1025, 14336, device="cuda", generator=g)
    a, b = _leaf(a0, dtype), _leaf(b0, dtype)
    y = getattr(K, name)(a, b)
    a64, b64 = _leaf(a0.to(dtype), torch.float64), _leaf(b0.to(dtype), torch.float64)
    ref = getattr(glu_math, f"{name}_torch")(a64, b64)
    _check(name, "y", y, ref, dtype)
    dy = torch.randn_like(a0)
    for n_, x_, e_ in zip(
        ["da", "db"], _grads(y, [a, b], dy.to(dtype)), _grads(ref, [a64, b64], dy.double()), strict=True
    ):
        _check(name, n_, x_, e_, dtype)


# bits of bf16 results against the transformers code they replace: the Triton and CUDA fp32 activations may
# differ in their last fp32 bit, which flips a bf16 rounding now and then (1 ulp); where the rounding happens
# is the same, so the rest is bit-equal (rounding once instead differs on a large fraction of elements)
GLU_MAX_ULPS, GLU_MAX_DIFFERING = 1, 2e-3


def _bits_check(case, ours, ref, max_ulps=GLU_MAX_ULPS, max_differing=GLU_MAX_DIFFERING):
    assert ours.dtype == ref.dtype == torch.bfloat16 and ours.shape == ref.shape
    ulps, differing = bits_apart(ours, ref)
    print(f"[gpu-bits] {case} max_ulps={ulps} differing={differing:.2e}", flush=True)
    assert ulps <= max_ulps and differing <= max_differing, f"{case}: {ulps} ulps, {differing:.2e} differ"


@pytest.mark.parametrize("name,act", [("swiglu", "silu"), ("geglu", "gelu_pytorch_tanh")])
def test_glu_bf16_bits_as_transformers(name, act):
    """``act_fn(gate) * up`` as LlamaMLP / GemmaMLP compute it in bf16: forward and d up."""
    g = torch.Generator(device="cuda").manual_seed(6)
    gate = torch.randn(1025, 14336, device="cuda", generator=g) * 3
    if "gelu" in act:  # below -3 torch's own 1 + tanh(.) cancels: its last bits are those of CUDA's tanhf
        gate = gate.clamp(min=-3.0)
    gate = gate.bfloat16()
    up = (torch.randn(1025, 14336, device="cuda", generator=g) * 4).bfloat16()
    dy = torch.randn(1025, 14336, device="cuda", generator=g).bfloat16()
    outs, d_ups = [], []
    for fn in (lambda a, b: ACT2FN[act](a) * b, getattr(K, name)):
        u = up.clone().requires_grad_()
        out = fn(gate, u)
        outs.append(out)
        d_ups.append(torch.autograd.grad(out, u, dy)[0])
    _bits_check(f"{name} forward", outs[1], outs[0])
    _bits_check(f"{name} d up", d_ups[1], d_ups[0])


@pytest.mark.parametrize(
    "mlp_cls,config_cls,act,name",
    [
        (modeling_llama.LlamaMLP, LlamaConfig, "silu", "swiglu"),
        (modeling_gemma.GemmaMLP, GemmaConfig, "gelu_pytorch_tanh", "geglu"),
    ],
    ids=["llama", "gemma"],
)
def test_glu_mlp_bf16_as_unpatched(mlp_cls, config_cls, act, name):
    """The whole bf16 MLP: the patched forward's output against the unpatched module's, bit for bit but for the
    rare 1-ulp activation flips (each moves one term of a down_proj dot product by one bf16 ulp)."""
    config = config_cls(hidden_size=2048, intermediate_size=8192, hidden_act=act)
    torch.manual_seed(0)
    mlp = mlp_cls(config).to("cuda", torch.bfloat16)
    x = torch.randn(2048, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    x = x.bfloat16()
    with torch.no_grad():
        ref = mlp(x)
        ours = mlp.down_proj(getattr(K, name)(mlp.gate_proj(x), mlp.up_proj(x)))
    _bits_check(f"{mlp_cls.__name__} output", ours, ref, max_ulps=8, max_differing=0.05)


# ---------------------------------------------------------------- kernel options of the reference library's types
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["llama", "gemma", "none"])
def test_rms_norm_without_weight(dtype, mode):
    """``weight=None`` (no elementwise affine): ``x / rms(x)``, dx; and the fused add + RMSNorm without a weight."""
    g = torch.Generator(device="cuda").manual_seed(13)
    x0 = torch.randn(4099, 4096, device="cuda", generator=g)
    x = _leaf(x0, dtype)
    y = K.rms_norm(x, None, 1e-6, casting_mode=mode)
    assert y.dtype == dtype
    x64 = _leaf(x0.to(dtype), torch.float64)
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    case = f"rms_norm {mode} no weight"
    _check(case, "y", y, ref, dtype)
    dy = torch.randn_like(x0)
    _check(case, "dx", *_grads(y, [x], dy.to(dtype)), *_grads(ref, [x64], dy.double()), dtype)
    if mode == "none":
        return
    r0 = torch.randn(4099, 4096, device="cuda", generator=g)
    x, r = _leaf(x0, dtype), _leaf(r0, dtype)
    s, y = K.add_rms_norm(x, r, None, 1e-6, casting_mode=mode)
    x64, r64 = _leaf(x0.to(dtype), torch.float64), _leaf(r0.to(dtype), torch.float64)
    s64 = r64 + x64
    ref = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6)
    case = f"add_rms_norm {mode} no weight"
    _check(case, "y", y, ref, dtype)
    got = _grads((s, y), [x, r], (dy.to(dtype), dy.to(dtype)))
    exp = _grads((s64, ref), [x64, r64], (dy.double(), dy.double()))
    for name, a, e in zip(["dx", "dresidual"], got, exp, strict=True):
        _check(case, name, a, e, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_glu_multipliers(dtype, name):
    """Falcon-H1's ``mlp_multipliers``: ``act(gate * 0.7) * up * 1.3``."""
    g = torch.Generator(device="cuda").manual_seed(14)
    a0 = torch.randn(1025, 14336, device="cuda", generator=g) * 2
    b0 = torch.randn(1025, 14336, device="cuda", generator=g)
    a, b = _leaf(a0, dtype), _leaf(b0, dtype)
    y = getattr(K, name)(a, b, gate_multiplier=0.7, down_multiplier=1.3)
    a64, b64 = _leaf(a0.to(dtype), torch.float64), _leaf(b0.to(dtype), torch.float64)
    ref = getattr(glu_math, f"{name}_torch")(a64, b64, 0.7, 1.3)
    case = f"{name} multipliers"
    _check(case, "y", y, ref, dtype)
    dy = torch.randn_like(a0)
    for n_, x_, e_ in zip(
        ["da", "db"], _grads(y, [a, b], dy.to(dtype)), _grads(ref, [a64, b64], dy.double()), strict=True
    ):
        _check(case, n_, x_, e_, dtype)


def test_glu_gate_multiplier_bf16_bits_as_falcon_h1():
    """``up * silu(gate * m)`` as FalconH1MLP computes it in bf16 (the scaled gate rounded first): forward, d up."""
    g = torch.Generator(device="cuda").manual_seed(15)
    gate = (torch.randn(1025, 14336, device="cuda", generator=g) * 3).bfloat16()
    up = (torch.randn(1025, 14336, device="cuda", generator=g) * 4).bfloat16()
    dy = torch.randn(1025, 14336, device="cuda", generator=g).bfloat16()
    outs, d_ups = [], []
    for fn in (lambda a, b: b * F.silu(a * 0.7), lambda a, b: K.swiglu(a, b, gate_multiplier=0.7)):
        u = up.clone().requires_grad_()
        out = fn(gate, u)
        outs.append(out)
        d_ups.append(torch.autograd.grad(out, u, dy)[0])
    _bits_check("swiglu gate multiplier forward", outs[1], outs[0])
    _bits_check("swiglu gate multiplier d up", d_ups[1], d_ups[0])


def test_falcon_h1_mlp_bf16_as_unpatched():
    """The whole bf16 FalconH1MLP (multipliers not 1, biases) against the swiglu drop-in's forward."""
    from transformers.models.falcon_h1 import modeling_falcon_h1
    from transformers.models.falcon_h1.configuration_falcon_h1 import FalconH1Config

    from liger_registry.modules.glu import swiglu_forward
    from liger_registry.schemas import GluSpec

    config = FalconH1Config(
        hidden_size=2048, intermediate_size=8192, mlp_multipliers=[0.7, 1.3], mlp_bias=True
    )
    torch.manual_seed(0)
    mlp = modeling_falcon_h1.FalconH1MLP(config).to("cuda", torch.bfloat16)
    x = torch.randn(2048, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    x = x.bfloat16()
    with torch.no_grad():
        ref, ours = mlp(x), swiglu_forward(GluSpec(targets=["FalconH1MLP"]))(mlp, x)
    _bits_check("FalconH1MLP output", ours, ref, max_ulps=8, max_differing=0.05)


# head_dim, cos/sin shape (2-D: the vision towers' [seq, C]), what liger-kernel's rope accepts beyond HF's
ROPE_TABLES = {
    "2d-table": (128, (1000, 128)),
    "odd-head-dim": (81, (1, 1000, 81)),
    "table-wider-than-head": (64, (2, 1000, 96)),
    "odd-head-dim-2d-half-table": (81, (1000, 40)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("table", list(ROPE_TABLES))
def test_rope_tables(dtype, table):
    g = torch.Generator(device="cuda").manual_seed(16)
    d, shape = ROPE_TABLES[table]
    b, hq, hk, s = 2, 32, 8, 1000
    q0 = torch.randn(b, s, hq, d, device="cuda", generator=g)
    k0 = torch.randn(b, s, hk, d, device="cuda", generator=g)
    ang = torch.randn(*shape, device="cuda", generator=g) * 10
    q = q0.to(dtype).transpose(1, 2).requires_grad_()
    k = k0.to(dtype).transpose(1, 2).requires_grad_()
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    qo, ko = K.rope(q, k, cos, sin)
    q64, k64 = _leaf(q, torch.float64), _leaf(k, torch.float64)
    qr, kr = rope_torch(q64, k64, cos.double(), sin.double())
    case = f"rope {table}"
    _check(case, "q", qo, qr, dtype)
    _check(case, "k", ko, kr, dtype)
    gq, gk = torch.randn_like(qr), torch.randn_like(kr)
    got = torch.autograd.grad((qo, ko), [q, k], (gq.to(dtype), gk.to(dtype)))
    exp = torch.autograd.grad((qr, kr), [q64, k64], (gq, gk))
    _check(case, "dq", got[0], exp[0], dtype)
    _check(case, "dk", got[1], exp[1], dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_bf16_conventions(reduction):
    """The logits' dtype back, the structured output, -1 predicted on ignored rows, torch's loss."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = (torch.randn(1031, 50257, device="cuda", generator=g) * 3).bfloat16()
    t = torch.randint(0, 50257, (1031,), device="cuda", generator=g)
    t[::5] = -100
    out = K.cross_entropy(
        x,
        t,
        reduction=reduction,
        return_z_loss=True,
        return_token_accuracy=True,
        return_predicted_tokens=True,
    )
    ref = F.cross_entropy(x.float(), t, reduction=reduction)
    assert out.loss.dtype == out.z_loss.dtype == torch.bfloat16
    torch.testing.assert_close(out.loss, ref.bfloat16(), rtol=2**-7, atol=0.0)
    valid = t != -100
    pred = torch.where(valid, x.float().argmax(-1), -1)
    assert torch.equal(out.predicted_tokens, pred)
    torch.testing.assert_close(out.token_accuracy, (pred == t)[valid].float().mean())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd(dtype, beta):
    from liger_registry.kernels.jsd.reference import jsd_rows_differentiable

    g = torch.Generator(device="cuda").manual_seed(7)
    n, h, v = 1027, 512, 32007
    sh0, th0 = torch.randn(n, h, device="cuda", generator=g), torch.randn(n, h, device="cuda", generator=g)
    sw0, tw0 = (
        torch.randn(v, h, device="cuda", generator=g) * 0.05,
        torch.randn(v, h, device="cuda", generator=g) * 0.05,
    )
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[::4] = -100
    sh, sw = _leaf(sh0, dtype), _leaf(sw0, dtype)
    out = K.fused_linear_jsd(sh, sw, th0.to(dtype), tw0.to(dtype), t, jsd_beta=beta, temperature=2.0)
    sh64, sw64 = _leaf(sh0.to(dtype), torch.float64), _leaf(sw0.to(dtype), torch.float64)
    rows = jsd_rows_differentiable(
        sh64 @ sw64.t(), th0.to(dtype).double() @ tw0.to(dtype).double().t(), beta, 2.0
    )
    valid = t != -100
    ref = rows[valid].sum() / valid.sum()
    case = f"fused_linear_jsd beta={beta}"
    _check(case, "loss", out, ref, dtype)
    for name, a, e in zip(
        ["d_hidden", "d_weight"], _grads(out, [sh, sw], None), _grads(ref, [sh64, sw64], None), strict=True
    ):
        _check(case, name, a, e, dtype)


def _rel(out, ref) -> float:
    out64, ref64 = out.detach().double(), ref.detach().double()
    return ((out64 - ref64).norm() / ref64.norm().clamp(min=1e-300)).item()


def _llama_head(inputs: str, bt: int = 2048, h: int = 4096, v: int = 128256):
    """bf16 Llama-3-shaped head inputs: "random" (dense softmax) or "peaked" (hidden leans on the target row,
    loss about 2, as ANCHORS.md's confident inputs)."""
    g = torch.Generator(device="cuda").manual_seed(11)
    weight = torch.randn(v, h, device="cuda", generator=g) * 0.02
    hidden = torch.randn(bt, h, device="cuda", generator=g)
    target = torch.randint(0, v, (bt,), device="cuda", generator=g)
    if inputs == "peaked":
        hidden = hidden + 6.5 * weight[target]
    return hidden.bfloat16(), weight.bfloat16(), target


@pytest.mark.parametrize("inputs", ["random", "peaked"])
def test_flce_strategies_vs_float64(inputs):
    """Both strategies at the C=1 budget against float64 on the same bf16 inputs: vocab's dX/dW errors no worse
    than tokens' x 1.1, the loss of each within 1e-5 relative (bf16 logits + the exact fp32 target logit)."""
    hidden, weight, target = _llama_head(inputs)
    h64, w64 = _leaf(hidden, torch.float64), _leaf(weight, torch.float64)
    ref = F.cross_entropy(h64 @ w64.t(), target)
    rdh, rdw = torch.autograd.grad(ref, [h64, w64])
    del h64, w64
    errs = {}
    for strategy in ("tokens", "vocab"):
        h, w = _leaf(hidden, torch.bfloat16), _leaf(weight, torch.bfloat16)
        out = K.fused_linear_cross_entropy(h, w, target, strategy=strategy, chunk_mem_const=1)
        dh, dw = torch.autograd.grad(out, [h, w])
        errs[strategy] = {"loss": _rel(out, ref), "d_hidden": _rel(dh, rdh), "d_weight": _rel(dw, rdw)}
        del dh, dw
    print(f"\n[gpu-check] flce strategies {inputs} (loss64 {ref.item():.3f}): {errs}", flush=True)
    for name in ("d_hidden", "d_weight"):
        ROWS.append(
            {
                "case": f"flce 2048x4096x128256 {inputs}",
                "tensor": f"{name} v/t",
                "dtype": "bfloat16",
                "err": errs["vocab"][name],
                "tol": errs["tokens"][name] * 1.1,
                "ok": errs["vocab"][name] <= errs["tokens"][name] * 1.1,
            }
        )
        assert errs["vocab"][name] <= errs["tokens"][name] * 1.1, (name, errs)
    assert errs["vocab"]["loss"] <= 1e-5 and errs["tokens"]["loss"] <= 1e-5, errs
    if inputs == "peaked":
        assert 1.0 < ref.item() < 3.5


def test_flce_vocab_fp32_paths_agree(monkeypatch):
    """dX accumulated by cuBLAS in fp32 (``addmm(out_dtype=fp32)``, when this torch has it) vs upcast operands:
    both right, and the loss (bf16 logits + the exact fp32 target logit) within 1e-5 of float64 on both."""
    from liger_registry.kernels.flce import vocab as flce_vocab

    hidden, weight, target = _llama_head("peaked", bt=1024, h=1024, v=32000)
    h64, w64 = _leaf(hidden, torch.float64), weight.double()
    ref = F.cross_entropy(h64 @ w64.t(), target)
    (r,) = torch.autograd.grad(ref, h64)
    results = []
    for path in (flce_vocab._has_out_dtype("cuda"), False):
        monkeypatch.setattr(flce_vocab, "_has_out_dtype", lambda _t, path=path: path)
        h = _leaf(hidden, torch.bfloat16)
        out = K.fused_linear_cross_entropy(h, weight, target, strategy="vocab", max_chunk_mib=4)
        (d,) = torch.autograd.grad(out, h)
        print(
            f"[gpu-check] vocab out_dtype={path} loss rel {_rel(out, ref):.2e} d_hidden rel {_rel(d, r):.2e}"
        )
        assert _rel(out, ref) < 1e-5 and _rel(d, r) < 1e-2
        results.append(d)
    assert _rel(results[0], results[1]) < 5e-3


@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
def test_flce_step_has_no_host_sync(strategy):
    """A whole FLCE step (forward + backward) is capturable in a CUDA graph: nothing in it waits for the GPU,
    so the host can queue ahead (the backward's 'grad_output == 1' check runs on the device). The replay gives
    the same gradients, and a loss scaled by 0.5 halves them."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(512, 256, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(5000, 256, device="cuda", generator=g) * 0.05).bfloat16().requires_grad_()
    t = torch.randint(0, 5000, (512,), device="cuda", generator=g)
    scale = torch.ones((), device="cuda")

    def step():
        x.grad = w.grad = None
        (K.fused_linear_cross_entropy(x, w, t, strategy=strategy, chunk_mem_const=1) * scale).backward()

    step()
    eager = (x.grad.clone(), w.grad.clone())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (K.fused_linear_cross_entropy(x, w, t, strategy=strategy, chunk_mem_const=1) * scale).backward()
    for factor in (1.0, 0.5):
        scale.fill_(factor)
        x.grad.zero_()
        w.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(x.grad, eager[0] * factor)
        torch.testing.assert_close(w.grad, eager[1] * factor)


def _median_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def test_flce_bad_labels_raise_and_the_check_is_cheap(monkeypatch):
    """The Triton path refuses out-of-range labels (no out-of-bounds read), and the label check (one aminmax and
    one host read per call, kernels/ce/labels.py) costs < 2% of an FLCE forward+backward at BT 4096, V 128256."""
    from liger_registry.kernels.flce import op as flce_api

    monkeypatch.setenv(K.ENV_VAR, "triton")
    g = torch.Generator(device="cuda").manual_seed(0)
    bt, h, v = 4096, 4096, 128256
    x = (torch.randn(bt, h, device="cuda", generator=g) * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * 0.02).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, v, (bt,), device="cuda", generator=g)
    for bad in (v, -1, v + 10**6):
        wrong = target.clone()
        wrong[7] = bad
        with pytest.raises(ValueError, match=f"out of range: {bad}"):
            K.fused_linear_cross_entropy(x, w, wrong)
        with pytest.raises(ValueError, match=f"out of range: {bad}"):
            K.cross_entropy(torch.randn(8, v, device="cuda"), wrong[:8])

    def step():
        K.fused_linear_cross_entropy(x, w, target).backward()
        x.grad = w.grad = None

    def no_check(target, *args):
        return target, lambda: None

    checked, unchecked = [], []
    for _ in range(7):  # interleaved, so clock and thermal drift hit both sides alike
        checked.append(_median_ms(step, reps=5))
        monkeypatch.setattr(flce_api, "start_label_check", no_check)
        unchecked.append(_median_ms(step, reps=5))
        monkeypatch.undo()
        monkeypatch.setenv(K.ENV_VAR, "triton")
    checked, unchecked = sorted(checked)[3], sorted(unchecked)[3]
    overhead = (checked - unchecked) / unchecked
    print(f"\nlabel check: {checked:.3f} ms vs {unchecked:.3f} ms unchecked ({overhead:+.2%})")
    assert overhead < 0.02, f"label check costs {overhead:.2%} of the FLCE call"


def _vocab_step_and_peak(hidden, weight, target):
    """(loss, dh, dw, peak MiB above the inputs) of one vocab-strategy FLCE forward + grad at the C=1 budget."""
    h, w = _leaf(hidden, torch.bfloat16), _leaf(weight, torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = K.fused_linear_cross_entropy(h, w, target, strategy="vocab", chunk_mem_const=1)
    dh, dw = torch.autograd.grad(out, [h, w])
    torch.cuda.synchronize()
    return out.detach(), dh, dw, (torch.cuda.max_memory_allocated() - base) / 2**20


@pytest.mark.parametrize("bt", [2048, 4096])
def test_flce_vocab_scratch_same_grads_and_no_more_memory(monkeypatch, bt):
    """The vocab strategy with chunks in dW's not yet written memory (Llama-3 head, C=1), every chunk kept for pass
    2 (N <= H, the default there: 6 chunks at 2048 tokens, 33 at 4096) and only pass 1's last one: the same loss
    and gradients as the plain geometry (budget-buffer chunks only), and no higher peak."""
    from liger_registry.kernels.flce import vocab as flce_vocab
    from liger_registry.kernels.flce.plan import plain_geometry, vocab_geometry

    hidden, weight, target = _llama_head("random", bt)
    layouts = {
        "kept": lambda n, h, v, w, scratch, multiple, keep: vocab_geometry(
            n, h, v, w, scratch, multiple, True
        ),
        "one_kept": lambda n, h, v, w, scratch, multiple, keep: vocab_geometry(
            n, h, v, w, scratch, multiple, False
        ),
        "plain": lambda n, h, v, w, *a: plain_geometry(v, w),
    }
    results = {}
    for name, layout in layouts.items():
        monkeypatch.setattr(flce_vocab, "vocab_geometry", layout)
        results[name] = _vocab_step_and_peak(hidden, weight, target)
    monkeypatch.setattr(flce_vocab, "vocab_geometry", vocab_geometry)
    lp, dhp, dwp, mp = results.pop("plain")
    for name, (ls, dhs, dws, ms) in results.items():
        print(f"\n[gpu-check] vocab {bt} {name} peak {ms:.1f} MiB vs plain {mp:.1f} MiB", flush=True)
        assert _rel(ls, lp) < 1e-5 and _rel(dhs, dhp) < 5e-3 and _rel(dws, dwp) < 5e-3, name
        assert ms <= mp + 1.0, name


@pytest.mark.parametrize("bt", [4096, 8192])
def test_flce_vocab_peak_is_dw_accumulator_and_buffer(bt):
    """The vocab strategy's peak above its inputs (Llama-3 head, C=1, the default layout) is dW, dX's fp32
    accumulator and the larger of the logits buffer and dX itself: the buffer is free before dX is cast out of
    the accumulator, so the cast reuses its memory (or needs only its own when it is the larger)."""
    from liger_registry.kernels.flce import plan as flce_cost
    from liger_registry.kernels.flce import plan as flce_planner
    from liger_registry.kernels.flce.plan import vocab_geometry

    hidden, weight, target = _llama_head("random", bt)
    n, h, v = bt, hidden.shape[1], weight.shape[0]
    plan = K.flce_plan(n, h, v, strategy="vocab", chunk_mem_const=1)
    multiple = min(flce_planner.COL_MULTIPLE, flce_planner.VOCAB_ALIGN)
    peaks = flce_cost.peaks_of(hidden.device)
    keep = flce_cost.keeps_every_chunk(n, h, v, plan.chunk_vocab, 2, peaks, multiple)
    geometry = vocab_geometry(n, h, v, plan.chunk_vocab, True, multiple, keep)
    peak = _vocab_step_and_peak(hidden, weight, target)[-1]
    mib = lambda b: b / 2**20  # noqa: E731
    bound = mib(v * h * 2 + n * h * 4 + max(n * geometry.buffer_cols * 2, n * h * 2)) + 4.0
    print(
        f"\n[gpu-check] vocab {bt} peak {peak:.1f} MiB, bound {bound:.1f} MiB "
        f"(buffer {mib(n * geometry.buffer_cols * 2):.1f}, dX {mib(n * h * 2):.1f})",
        flush=True,
    )
    assert peak <= bound


def test_deepseek_v4_rope_bf16_as_unpatched():
    """V4's trailing interleaved rope of one tensor (head 512, rope 64, q transposed heads-first; -sin as its
    attention output), bf16 q with fp32 tables: forward bits and gradients against V4's own function."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4

    from liger_registry.modules.rope import apply_rotary_pos_emb_one_tensor_trailing as ours

    g = torch.Generator(device="cuda").manual_seed(17)
    b, s, h, d, r = 2, 2048, 16, 512, 64
    x0 = torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16()
    ang = torch.randn(b, s, r // 2, device="cuda", generator=g) * 10
    for sign in (1, -1):
        cos, sin = ang.cos(), sign * ang.sin()
        outs = []
        for fn in (ours, modeling_deepseek_v4.apply_rotary_pos_emb):
            x = x0.clone().requires_grad_()
            y = fn(x.transpose(1, 2), cos, sin)
            (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
            outs.append((y, dx))
        case = f"deepseek_v4 rope sin x {sign}"
        # 2 ulps: x cos - y sin in fp32 (an FMA in the kernel, mul then sub in V4's) cancels to a value far
        # below its terms in a few elements, where one fp32 ulp of a term is two bf16 ulps of the result.
        _bits_check(f"{case} output", outs[0][0], outs[1][0], max_ulps=2, max_differing=0.01)
        _check(case, "dx", outs[0][1], outs[1][1], torch.bfloat16)


@pytest.mark.parametrize("sparsity", [0.95, 0.0])
def test_gemma3n_mlp_with_gate_sparsity_bf16_as_unpatched(sparsity):
    """Gemma3nTextMLP (a gaussian top-k on the gate where activation_sparsity > 0, then gelu_tanh(gate) * up)
    against the geglu drop-in with gate_sparsity, bf16 on the Triton kernel: forward bits and gradients."""
    from transformers.models.gemma3n import modeling_gemma3n
    from transformers.models.gemma3n.configuration_gemma3n import Gemma3nTextConfig

    from liger_registry.modules.glu import geglu_forward
    from liger_registry.schemas import GluSpec

    config = Gemma3nTextConfig(
        hidden_size=2048,
        intermediate_size=[8192],
        num_hidden_layers=1,
        activation_sparsity_pattern=[sparsity],
        hidden_activation="gelu_pytorch_tanh",
    )
    torch.manual_seed(0)
    mlp = modeling_gemma3n.Gemma3nTextMLP(config, layer_idx=0).to("cuda", torch.bfloat16)
    x = torch.randn(
        4096, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7)
    ).bfloat16()
    forward = geglu_forward(GluSpec(targets=["Gemma3nTextMLP"], gate_sparsity="activation_sparsity"))
    outs = []
    for fn in (lambda t: forward(mlp, t), mlp):
        xi = x.clone().requires_grad_()
        y = fn(xi)
        (dx,) = torch.autograd.grad(y, xi, torch.ones_like(y))
        outs.append((y, dx))
    _bits_check(f"Gemma3nTextMLP sparsity {sparsity} output", outs[0][0], outs[1][0])
    _check(f"Gemma3nTextMLP sparsity {sparsity}", "dx", outs[0][1], outs[1][1], torch.bfloat16)


def test_deepseek_v4_shared_expert_bf16_as_unpatched():
    """DeepseekV4MLP (gate and up clamped at swiglu_limit, then silu(gate) * up) against the swiglu drop-in with
    its limit, bf16, pre-activations wide enough that a fifth of them are clamped."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    from liger_registry.modules.glu import swiglu_forward
    from liger_registry.schemas import GluSpec

    config = DeepseekV4Config(hidden_size=2048, intermediate_size=4096, swiglu_limit=10.0)
    torch.manual_seed(0)
    mlp = modeling_deepseek_v4.DeepseekV4MLP(config).to("cuda", torch.bfloat16)
    x = torch.randn(2048, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7)) * 15
    x = x.bfloat16()
    with torch.no_grad():
        assert (mlp.up_proj(x).abs() > 10).float().mean() > 0.05
        ref = mlp(x)
        out = swiglu_forward(GluSpec(targets=["DeepseekV4MLP"], limit="limit"))(mlp, x)
    _bits_check("DeepseekV4MLP output", out, ref, max_ulps=8, max_differing=0.05)


@pytest.mark.parametrize("in_place", [False, True])
def test_glu_backward_peak_in_place(in_place):
    """An MLP's GLU backward, bf16 [8192, 8192] gate and up: the in-place backward allocates no gradient buffers
    (out of place: two of the inputs' size), with the same gradients."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8192, 256, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = torch.randn(256, 2 * 8192, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
    gate, up = (x @ w).split(8192, dim=1)
    gate, up = gate.contiguous(), up.contiguous()
    y = K.swiglu(gate, up, in_place_backward=in_place)
    dy = torch.randn(y.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    ref_gate, ref_up = gate.detach().clone().requires_grad_(), up.detach().clone().requires_grad_()
    want = torch.autograd.grad(glu_math.swiglu_torch(ref_gate, ref_up), [ref_gate, ref_up], dy)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    got = torch.autograd.grad(y, [gate, up], dy)
    torch.cuda.synchronize()
    extra_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    print(f"\n[gpu-peak] swiglu backward in_place={in_place}: {extra_mib:.1f} MiB above its inputs")
    assert extra_mib < (1.0 if in_place else 300.0) and (in_place or extra_mib > 250.0)
    for a, e in zip(got, want, strict=True):
        assert (a.float() - e.float()).norm() / e.float().norm() < 2e-2
