"""PyTorch implementations of the small ops against HF modules and plain autograd references."""

import pytest
import torch
import torch.nn.functional as F
from kernel_refs import ce_reference
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from liger_registry import kernels as K
from liger_registry.kernels.jsd.reference import jsd_rows_differentiable


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_rms_norm_llama_is_hf_llama_exactly():
    m = LlamaRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        m.weight.copy_(torch.randn(24, generator=_g()))
    x = torch.randn(3, 5, 24, generator=_g(1))
    assert torch.equal(K.rms_norm(x, m.weight, 1e-5), m(x))
    # bf16 input, fp32 weight (mixed, as HF does it)
    xb = x.bfloat16()
    assert torch.equal(K.rms_norm(xb, m.weight, 1e-5), m(xb))


def test_rms_norm_gemma_is_hf_gemma3_exactly():
    m = Gemma3RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        m.weight.copy_(torch.randn(24, generator=_g()) * 0.1)
    for x in (torch.randn(4, 24, generator=_g(2)), torch.randn(4, 24, generator=_g(2)).bfloat16()):
        assert torch.equal(K.rms_norm(x, m.weight, 1e-6, offset=1.0, casting_mode="gemma"), m(x))


def test_rms_norm_none_and_grads():
    x = torch.randn(6, 16, generator=_g(), dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, generator=_g(1), dtype=torch.float64, requires_grad=True)
    y = K.rms_norm(x, w, 1e-6, offset=0.5, casting_mode="none")
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (0.5 + w)
    torch.testing.assert_close(y, ref)
    assert torch.autograd.gradcheck(lambda a, b: K.rms_norm(a, b, 1e-6, 0.5, "none"), (x, w))
    with pytest.raises(ValueError, match="casting_mode"):
        K.rms_norm(x, w, 1e-6, casting_mode="bogus")


def test_rope_is_hf_apply_rotary_pos_emb():
    b, hq, hk, s, d = 2, 4, 2, 7, 8
    q = torch.randn(b, hq, s, d, generator=_g())
    k = torch.randn(b, hk, s, d, generator=_g(1))
    pos = torch.arange(s, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.cat([pos[:, None] * inv[None], pos[:, None] * inv[None]], -1)
    for cos, sin in (
        (ang.cos()[None], ang.sin()[None]),
        (ang.cos()[None].expand(b, -1, -1), ang.sin()[None].expand(b, -1, -1)),
    ):
        qo, ko = K.rope(q, k, cos, sin)
        qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
        assert torch.equal(qo, qr) and torch.equal(ko, kr)
    with pytest.raises(ValueError, match="rope"):
        K.rope(q[0], k, ang.cos()[None], ang.sin()[None])


@pytest.mark.parametrize(
    "name,fn",
    [("swiglu", lambda a, b: F.silu(a) * b), ("geglu", lambda a, b: F.gelu(a, approximate="tanh") * b)],
)
def test_glu(name, fn):
    a = torch.randn(5, 33, generator=_g(), dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 33, generator=_g(1), dtype=torch.float64, requires_grad=True)
    op = getattr(K, name)
    torch.testing.assert_close(op(a, b), fn(a, b))
    assert torch.autograd.gradcheck(op, (a, b))


def test_layer_norm():
    x = torch.randn(5, 12, generator=_g(), dtype=torch.float64, requires_grad=True)
    w = torch.randn(12, generator=_g(1), dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, generator=_g(2), dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(K.layer_norm(x, w, b, 1e-5), F.layer_norm(x, (12,), w, b, 1e-5))
    torch.testing.assert_close(K.layer_norm(x, w, None, 1e-5), F.layer_norm(x, (12,), w, None, 1e-5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "opts",
    [{}, {"label_smoothing": 0.1}, {"lse_square_scale": 1e-2}, {"class_weights": True}, {"softcap": 4.0}],
    ids=lambda o: "-".join(o) or "plain",
)
def test_cross_entropy(opts, reduction):
    logits = torch.randn(9, 40, generator=_g(), requires_grad=True)
    target = torch.randint(0, 40, (9,), generator=_g(1))
    target[2] = -100
    opts = dict(opts)
    if opts.get("class_weights"):
        opts["class_weights"] = torch.rand(40, generator=_g(3)) + 0.5
    softcap = opts.pop("softcap", None)
    weight = opts.pop("class_weights", None)
    got = K.cross_entropy(logits, target, weight, reduction=reduction, softcap=softcap, **opts)
    opts["class_weights"] = weight
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    ref, _ = ce_reference(z, target, reduction=reduction, **opts)
    torch.testing.assert_close(got, ref)
    go = torch.randn_like(ref)
    (g1,) = torch.autograd.grad(got, logits, go)
    (g2,) = torch.autograd.grad(ref, logits, go)
    torch.testing.assert_close(g1, g2)


def _jsd_ref(sh, sw, th, tw, target, beta, temperature, ignore_index=-100):
    rows = jsd_rows_differentiable(sh @ sw.t(), th @ tw.t(), beta, temperature)
    valid = torch.ones_like(rows, dtype=torch.bool) if target is None else target != ignore_index
    return (rows * valid).sum() / valid.sum().clamp(min=1)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 0.3])
@pytest.mark.parametrize("with_target", [False, True])
def test_fused_linear_jsd(beta, with_target):
    n, h, ht, v = 37, 16, 12, 50
    sh = torch.randn(n, h, generator=_g(), requires_grad=True)
    sw = (torch.randn(v, h, generator=_g(1)) * 0.5).requires_grad_()
    th = torch.randn(n, ht, generator=_g(2))
    tw = torch.randn(v, ht, generator=_g(3)) * 0.5
    target = torch.randint(0, v, (n,), generator=_g(4)) if with_target else None
    if with_target:
        target[::3] = -100
    loss = K.fused_linear_jsd(sh, sw, th, tw, target, jsd_beta=beta, temperature=2.0)
    ref = _jsd_ref(sh, sw, th, tw, target, beta, 2.0)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    g = torch.autograd.grad(loss * 1.5, [sh, sw])
    r = torch.autograd.grad(ref * 1.5, [sh, sw])
    for a, e in zip(g, r, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_fused_linear_jsd_checks():
    sh, sw = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(ValueError, match="chunk_mem_const"):
        K.fused_linear_jsd(sh, sw, sh, sw, chunk_mem_const=True)
    with pytest.raises(ValueError, match="jsd_beta"):
        K.fused_linear_jsd(sh, sw, sh, sw, jsd_beta=1.5)
