"""The RoPE layouts of the families whose rotary function is not q-and-k rotate-half: DeepSeek-V2's complex
product on heads-first q/k, DeepSeek-V3's / GLM-4-MoE-Lite's interleaved pairs written as halves, Gemma 4's one
tensor per call, DeepSeek-V4's trailing slice of one tensor. Each drop-in against the family's own transformers
function, forward and the gradients of its inputs, on both backends (Triton through the interpreter on CPU): the
torch path bit-equal, Triton to a tight tolerance; on CUDA, V4's bf16 rope against V4's function."""

from __future__ import annotations

import pytest
import torch
from cases import bits_check, cuda_g, g, gpu
from cases import check64 as _check
from transformers.models.deepseek_v2 import modeling_deepseek_v2
from transformers.models.deepseek_v3 import modeling_deepseek_v3
from transformers.models.deepseek_v4 import modeling_deepseek_v4
from transformers.models.gemma4 import modeling_gemma4
from transformers.models.glm4_moe_lite import modeling_glm4_moe_lite

from liger_registry.modules import rope as drop_ins

B, HQ, S, NOPE, ROT = 2, 3, 5, 4, 8
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}
DTYPES = [torch.float32, torch.float16]


def _mla_qk(dtype):
    """MLA's rotary parts: q_rot a slice of the transposed [b, s, h, nope + rot] projection, k_rot one head."""
    q = torch.randn(B, S, HQ, NOPE + ROT, generator=g(0)).to(dtype).requires_grad_()
    k = torch.randn(B, S, ROT, generator=g(1)).to(dtype).requires_grad_()
    q_rot = q.transpose(1, 2)[..., NOPE:]
    k_rot = k.view(B, 1, S, ROT)
    return (q, k), (q_rot, k_rot)


def _angles(width):
    return torch.randn(B, S, width, generator=g(2)) * 3


def _grads(outs, leaves):
    gs = [torch.randn(o.shape, generator=g(4 + i)).to(o.dtype) for i, o in enumerate(outs)]
    return torch.autograd.grad(outs, leaves, gs)


def _run(fn, make_inputs, *table):
    leaves, inputs = make_inputs()
    outs = fn(*inputs, *table)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return (*outs, *_grads(outs, leaves))


def _compare(backend, ours, ref, dtype, exact=None):
    """``exact``: how many outputs (from the first) the torch path must match bit for bit (default all)."""
    exact = len(ours) if exact is None else exact
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        tol = 0.0 if backend == "torch" and i < exact else TOL[dtype]
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m, i=i: f"output {i}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "module", [modeling_deepseek_v3, modeling_glm4_moe_lite], ids=["deepseek_v3", "glm4_moe_lite"]
)
def test_deinterleave_matches_apply_rotary_pos_emb_interleave(backend, dtype, module):
    angle = _angles(ROT // 2)
    cos, sin = (torch.cat([t, t], -1).to(dtype) for t in (angle.cos(), angle.sin()))
    ours = _run(drop_ins.apply_rotary_pos_emb_interleave, lambda: _mla_qk(dtype), cos, sin)
    ref = _run(module.apply_rotary_pos_emb_interleave, lambda: _mla_qk(dtype), cos, sin)
    _compare(backend, ours, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_complex_heads_first_matches_deepseek_v2(backend, dtype):
    """fp32 complex product, results in q's / k's dtypes; attention_scaling folded into freqs_cis as V2 does."""
    angle = _angles(ROT // 2)
    freqs_cis = torch.polar(torch.ones_like(angle), angle) * 1.25
    ours = _run(drop_ins.apply_rotary_emb_heads_first, lambda: _mla_qk(dtype), freqs_cis)
    ref = _run(modeling_deepseek_v2.apply_rotary_emb, lambda: _mla_qk(dtype), freqs_cis)
    # the gradients are the op's transposed rotation, not autograd's complex product: equal to fp32 rounding
    _compare(backend, ours, ref, dtype, exact=2)


def _gemma4_x(dtype, unsqueeze_dim):
    x = torch.randn(B, S, HQ, ROT, generator=g(0)).to(dtype).requires_grad_()
    return (x,), (x if unsqueeze_dim == 2 else x.transpose(1, 2),)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("unsqueeze_dim", [2, 1])
def test_one_tensor_matches_gemma4(backend, dtype, unsqueeze_dim):
    angle = _angles(ROT // 2)
    cos, sin = (torch.cat([t, t], -1).to(dtype) for t in (angle.cos(), angle.sin()))

    def ours(x, cos, sin):
        return drop_ins.apply_rotary_pos_emb_one_tensor(x, cos, sin, unsqueeze_dim=unsqueeze_dim)

    def gemma4(x, cos, sin):
        return modeling_gemma4.apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=unsqueeze_dim)

    make = lambda: _gemma4_x(dtype, unsqueeze_dim)  # noqa: E731
    _compare(backend, _run(ours, make, cos, sin), _run(gemma4, make, cos, sin), dtype)


def test_one_tensor_serves_gemma4_vision_multidimensional_rope(backend, monkeypatch):
    """The vision tower calls it by keyword on each axis's channels, seq-first (unsqueeze_dim=2)."""
    x = torch.randn(B, S, HQ, 2 * ROT, generator=g(0))
    angle = _angles(2 * ROT)
    cos, sin, pos = angle.cos(), angle.sin(), torch.zeros(B, S, 2, dtype=torch.long)
    want = modeling_gemma4.apply_multidimensional_rope(x, cos, sin, pos)
    monkeypatch.setattr(modeling_gemma4, "apply_rotary_pos_emb", drop_ins.apply_rotary_pos_emb_one_tensor)
    got = modeling_gemma4.apply_multidimensional_rope(x, cos, sin, pos)
    tol = 0.0 if backend == "torch" else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def _v4_x(dtype, transposed):
    """V4's q: [b, s, h, nope + rope] transposed to heads-first, or a heads-first tensor (its kv, one head)."""
    x = torch.randn(B, S, HQ, NOPE + ROT, generator=g(0)).to(dtype).requires_grad_()
    return (x,), (x.transpose(1, 2) if transposed else x[:, :, :1].permute(0, 2, 1, 3).contiguous(),)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("table_dtype", ["x", "fp32"])
@pytest.mark.parametrize("inverse", [False, True], ids=["sin", "minus_sin"])
@pytest.mark.parametrize("transposed", [True, False], ids=["transposed", "contiguous"])
def test_one_tensor_trailing_matches_deepseek_v4(backend, dtype, table_dtype, inverse, transposed):
    """cos/sin one value per pair; the attention output is rotated back with -sin."""
    angle = _angles(ROT // 2)
    cos, sin = angle.cos(), angle.sin() * (-1 if inverse else 1)
    if table_dtype == "x":
        cos, sin = cos.to(dtype), sin.to(dtype)
    make = lambda: _v4_x(dtype, transposed)  # noqa: E731
    ours = _run(drop_ins.apply_rotary_pos_emb_one_tensor_trailing, make, cos, sin)
    ref = _run(modeling_deepseek_v4.apply_rotary_pos_emb, make, cos, sin)
    # V4's autograd rounds each of its two fp32 products' gradients to x's dtype and adds them there; the op's
    # transposed rotation rounds once: equal in fp32, to one half-precision ulp otherwise
    _compare(backend, ours, ref, dtype, exact=len(ours) if dtype == torch.float32 else 1)


@gpu
def test_deepseek_v4_rope_bf16_as_unpatched():
    """V4's trailing interleaved rope of one tensor (head 512, rope 64, q transposed heads-first; -sin as its
    attention output), bf16 q with fp32 tables: forward bits and gradients against V4's own function."""
    gen = cuda_g(17)
    b, s, h, d, r = 2, 2048, 16, 512, 64
    x0 = torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16()
    ang = torch.randn(b, s, r // 2, device="cuda", generator=gen) * 10
    for sign in (1, -1):
        cos, sin = ang.cos(), sign * ang.sin()
        outs = []
        for fn in (
            drop_ins.apply_rotary_pos_emb_one_tensor_trailing,
            modeling_deepseek_v4.apply_rotary_pos_emb,
        ):
            x = x0.clone().requires_grad_()
            y = fn(x.transpose(1, 2), cos, sin)
            (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
            outs.append((y, dx))
        case = f"deepseek_v4 rope sin x {sign}"
        # 2 ulps: x cos - y sin in fp32 (an FMA in the kernel, mul then sub in V4's) cancels to a value far
        # below its terms in a few elements, where one fp32 ulp of a term is two bf16 ulps of the result.
        bits_check(f"{case} output", outs[0][0], outs[1][0], max_ulps=2, max_differing=0.01)
        _check(case, "dx", outs[0][1], outs[1][1], torch.bfloat16)
