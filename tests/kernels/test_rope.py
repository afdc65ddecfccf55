"""RoPE (kernels/rope, q and k rotate-half): the PyTorch path bit-equal to HF's apply_rotary_pos_emb, Triton (the
interpreter on CPU) against it; the tables and head dims the reference library's rope accepts (a 2-D
``(seq, head_dim)`` cos/sin, an odd head_dim, a table wider than the rotated dims) on both backends, fp32 and fp16,
forward and the gradients of q and k; on CUDA, fp32 and bf16 against float64."""

from __future__ import annotations

import pytest
import torch
from cases import GPU_DTYPES, close, cuda_g, g, gpu, leaf, rope_torch
from cases import check64 as _check
from transformers.models.llama import modeling_llama
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rotary_pos_emb
from transformers.models.phi3 import modeling_phi3
from transformers.models.pixtral import modeling_pixtral

from liger_registry import kernels as K
from liger_registry.kernels.rotary import rope_variant
from liger_registry.modules.rope import apply_rotary_pos_emb

B, HQ, HK, S = 2, 3, 1, 5
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}
DTYPES = [torch.float32, torch.float16]


# ---------------------------------------------------------------- the PyTorch path against HF
def test_rope_is_hf_apply_rotary_pos_emb():
    b, hq, hk, s, d = 2, 4, 2, 7, 8
    q = torch.randn(b, hq, s, d, generator=g())
    k = torch.randn(b, hk, s, d, generator=g(1))
    pos = torch.arange(s, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.cat([pos[:, None] * inv[None], pos[:, None] * inv[None]], -1)
    for cos, sin in (
        (ang.cos()[None], ang.sin()[None]),
        (ang.cos()[None].expand(b, -1, -1), ang.sin()[None].expand(b, -1, -1)),
    ):
        qo, ko = K.rope(q, k, cos, sin)
        qr, kr = hf_apply_rotary_pos_emb(q, k, cos, sin)
        assert torch.equal(qo, qr) and torch.equal(ko, kr)
    with pytest.raises(ValueError, match="rope"):
        K.rope(q[0], k, ang.cos()[None], ang.sin()[None])


# ---------------------------------------------------------------- Triton through the interpreter
@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("batch_cos", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_triton(batch_cos, dtype):
    b, hq, hk, s, d = 2, 5, 3, 6, 12
    # HF layout through a transpose: q [B, S, H, D] -> [B, H, S, D] (non-contiguous)
    q = torch.randn(b, s, hq, d, generator=g()).to(dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, hk, d, generator=g(1)).to(dtype).transpose(1, 2).requires_grad_()
    ang = torch.randn(batch_cos, s, d // 2, generator=g(2))
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    qo, ko = K.rope(q, k, cos, sin)
    qr, kr = rope_torch(q, k, cos, sin)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    close(qo, qr, tol)
    close(ko, kr, tol)
    gq, gk = torch.randn_like(qr), torch.randn_like(kr)
    got = torch.autograd.grad((qo, ko), [q, k], (gq, gk))
    exp = torch.autograd.grad((qr, kr), [q, k], (gq, gk))
    for a, e in zip(got, exp, strict=True):
        close(a, e, tol)


@pytest.mark.usefixtures("triton_small")
def test_rope_one_output_unused():
    q = torch.randn(1, 2, 4, 8, generator=g()).requires_grad_()
    k = torch.randn(1, 1, 4, 8, generator=g(1)).requires_grad_()
    ang = torch.randn(1, 4, 8, generator=g(2))
    qo, _ = K.rope(q, k, ang.cos(), ang.sin())
    qo.sum().backward()
    qr, _ = rope_torch(q, k, ang.cos(), ang.sin())
    (eq,) = torch.autograd.grad(qr.sum(), q)
    close(q.grad, eq, 1e-5)
    assert k.grad is None or not k.grad.any()


# ---------------------------------------------------------------- the reference library's tables, both backends
def _qk(d, dtype, seq_first=True):
    """q/k [B, H, S, d]; seq-first projections seen heads-first (every attention layer's transposed view)."""
    if seq_first:
        q = torch.randn(B, S, HQ, d, generator=g(0)).to(dtype).transpose(1, 2)
        k = torch.randn(B, S, HK, d, generator=g(1)).to(dtype).transpose(1, 2)
    else:
        q = torch.randn(B, HQ, S, d, generator=g(0)).to(dtype)
        k = torch.randn(B, HK, S, d, generator=g(1)).to(dtype)
    return q.requires_grad_(), k.requires_grad_()


def _table(shape, dtype, duplicated=False):
    """cos/sin of random angles; ``duplicated``: HF's layout, both halves of the last dim equal."""
    if duplicated:
        half = torch.randn(*shape[:-1], shape[-1] // 2, generator=g(2)) * 3
        angle = torch.cat([half, half], -1)
    else:
        angle = torch.randn(*shape, generator=g(2)) * 3
    return angle.cos().to(dtype), angle.sin().to(dtype)


def _liger_contract(q, k, cos, sin):
    """The reference library's rope, written plainly: pairs (j, j + d // 2) rotated by ``cos[..., j]`` of the
    table's first d // 2 columns ([batch or 1, seq, C] or [seq, C]); an odd head_dim's last dim passes through."""
    half = q.shape[-1] // 2
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    c, s = cos[:, None, :, :half], sin[:, None, :, :half]
    out = []
    for x in (q, k):
        x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
        out.append(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), -1))
    return tuple(out)


def _run(fn, q, k, cos, sin):
    qo, ko = fn(q, k, cos, sin)
    gq = torch.randn(qo.shape, generator=g(4)).to(qo.dtype)
    gk = torch.randn(ko.shape, generator=g(5)).to(ko.dtype)
    return (qo, ko, *torch.autograd.grad((qo, ko), (q, k), (gq, gk)))


def _compare(backend, ours, ref, dtype):
    for name, a, b in zip(("q", "k", "dq", "dk"), ours, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        tol = 0.0 if backend == "torch" else TOL[dtype]
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


# head_dim, table shape (seq-first 2-D or batched 3-D), what it exercises
TABLES = {
    "odd-head-dim": (9, (1, S, 9)),
    "odd-head-dim-2d": (9, (S, 9)),
    "odd-head-dim-half-table": (7, (B, S, 3)),
    "table-wider-than-head": (8, (1, S, 12)),
    "table-wider-than-head-2d": (8, (S, 16)),
    "per-batch-wide-table": (6, (B, S, 10)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(TABLES))
def test_rope_accepts_what_the_reference_library_accepts(backend, name, dtype):
    d, shape = TABLES[name]
    q, k = _qk(d, dtype)
    cos, sin = _table(shape, dtype)
    _compare(backend, _run(K.rope, q, k, cos, sin), _run(_liger_contract, q, k, cos, sin), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seq_first", [True, False], ids=["transposed", "contiguous"])
def test_2d_table_is_hf_broadcast_over_batch_and_heads(backend, dtype, seq_first):
    """A [seq, head_dim] table rotates as HF's function does with that table [1, seq, head_dim]."""
    q, k = _qk(8, dtype, seq_first)
    cos, sin = _table((S, 8), dtype)  # halves differ: the per-element layout is what is compared
    ours = _run(K.rope, q, k, cos, sin)
    ref = _run(lambda *a: modeling_llama.apply_rotary_pos_emb(*a[:2], a[2][None], a[3][None]), q, k, cos, sin)
    _compare(backend, ours, ref, dtype)


def test_hf_and_reference_library_agree_on_hf_tables(backend):
    q, k = _qk(8, torch.float32)
    cos, sin = _table((1, S, 8), torch.float32, duplicated=True)
    ours = _run(K.rope, q, k, cos, sin)
    _compare("triton", ours, _run(_liger_contract, q, k, cos, sin), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("two_d", [False, True], ids=["3d", "2d"])
def test_variant_rotary_dim_reads_the_first_columns_of_a_wider_table(backend, dtype, two_d):
    """``rotary_dim=R`` with a table wider than R: phi3's partial rotate-half on the table's first R columns."""
    q, k = _qk(12, dtype)
    cos, sin = _table((S, 10) if two_d else (B, S, 10), dtype)

    def ours(q, k, cos, sin):
        return rope_variant(q, k, cos, sin, rotary_dim=6)

    def phi3(q, k, cos, sin):
        c, s = (t[None] if two_d else t for t in (cos[..., :6], sin[..., :6]))
        return modeling_phi3.apply_rotary_pos_emb(q, k, c, s)

    _compare(backend, _run(ours, q, k, cos, sin), _run(phi3, q, k, cos, sin), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_drop_in_matches_pixtral_2d_table(backend, dtype):
    """Pixtral's attention: q/k [batch, heads, patches, head_dim], a [patches, head_dim] table, unsqueeze_dim=0."""
    q, k = _qk(16, dtype)
    cos, sin = _table((S, 16), dtype, duplicated=True)

    def pixtral(*args):
        return modeling_pixtral.apply_rotary_pos_emb(*args, unsqueeze_dim=0)

    def ours(*args):
        return apply_rotary_pos_emb(*args, unsqueeze_dim=0)

    _compare(backend, _run(ours, q, k, cos, sin), _run(pixtral, q, k, cos, sin), dtype)


def test_rejects_tables_that_do_not_fit():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="narrower than rotary dim 8"):  # one cos per pair needs 4 columns
        K.rope(q, k, torch.randn(3, 3), torch.randn(3, 3))
    with pytest.raises(ValueError, match="does not match"):  # a 2-D table of another length
        K.rope(q, k, torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="0 with a 2-D cos/sin"):  # unsqueeze_dim=0 needs the 2-D table
        apply_rotary_pos_emb(q, k, torch.randn(1, 3, 8), torch.randn(1, 3, 8), unsqueeze_dim=0)
    with pytest.raises(ValueError, match=r"\[seq, C\]"):
        K.rope(q, k, torch.randn(3), torch.randn(3))
    with pytest.raises(ValueError, match="narrower than rotary dim 8"):
        rope_variant(q, k, torch.randn(3, 6), torch.randn(3, 6), rotary_dim=8)
    for bad in (5, 0, 10, 4.0):
        with pytest.raises(ValueError, match="must be an even int"):
            rope_variant(q, k, torch.randn(3, 16), torch.randn(3, 16), rotary_dim=bad)


# ---------------------------------------------------------------- CUDA: fp32 and bf16 against float64
@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_rope(dtype):
    gen = cuda_g(5)
    b, hq, hk, s, d = 2, 32, 8, 1000, 128
    q0 = torch.randn(b, s, hq, d, device="cuda", generator=gen)
    k0 = torch.randn(b, s, hk, d, device="cuda", generator=gen)
    ang = torch.randn(1, s, d // 2, device="cuda", generator=gen) * 10
    ang = torch.cat([ang, ang], -1)
    q = q0.to(dtype).transpose(1, 2).requires_grad_()
    k = k0.to(dtype).transpose(1, 2).requires_grad_()
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    qo, ko = K.rope(q, k, cos, sin)
    q64, k64 = leaf(q, torch.float64), leaf(k, torch.float64)
    qr, kr = rope_torch(q64, k64, cos.double(), sin.double())
    _check("rope", "q", qo, qr, dtype)
    _check("rope", "k", ko, kr, dtype)
    gq, gk = torch.randn_like(qr), torch.randn_like(kr)
    got = torch.autograd.grad((qo, ko), [q, k], (gq.to(dtype), gk.to(dtype)))
    exp = torch.autograd.grad((qr, kr), [q64, k64], (gq, gk))
    _check("rope", "dq", got[0], exp[0], dtype)
    _check("rope", "dk", got[1], exp[1], dtype)


# head_dim, cos/sin shape (2-D: the vision towers' [seq, C]), what liger-kernel's rope accepts beyond HF's
ROPE_TABLES = {
    "2d-table": (128, (1000, 128)),
    "odd-head-dim": (81, (1, 1000, 81)),
    "table-wider-than-head": (64, (2, 1000, 96)),
    "odd-head-dim-2d-half-table": (81, (1000, 40)),
}


@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("table", list(ROPE_TABLES))
def test_rope_tables(dtype, table):
    gen = cuda_g(16)
    d, shape = ROPE_TABLES[table]
    b, hq, hk, s = 2, 32, 8, 1000
    q0 = torch.randn(b, s, hq, d, device="cuda", generator=gen)
    k0 = torch.randn(b, s, hk, d, device="cuda", generator=gen)
    ang = torch.randn(*shape, device="cuda", generator=gen) * 10
    q = q0.to(dtype).transpose(1, 2).requires_grad_()
    k = k0.to(dtype).transpose(1, 2).requires_grad_()
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    qo, ko = K.rope(q, k, cos, sin)
    q64, k64 = leaf(q, torch.float64), leaf(k, torch.float64)
    qr, kr = rope_torch(q64, k64, cos.double(), sin.double())
    case = f"rope {table}"
    _check(case, "q", qo, qr, dtype)
    _check(case, "k", ko, kr, dtype)
    gq, gk = torch.randn_like(qr), torch.randn_like(kr)
    got = torch.autograd.grad((qo, ko), [q, k], (gq.to(dtype), gk.to(dtype)))
    exp = torch.autograd.grad((qr, kr), [q64, k64], (gq, gk))
    _check(case, "dq", got[0], exp[0], dtype)
    _check(case, "dk", got[1], exp[1], dtype)
