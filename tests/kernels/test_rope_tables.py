"""RoPE with the tables and head dims the reference library's rope accepts: a 2-D ``(seq, head_dim)`` cos/sin
(the vision towers', broadcast over batch and heads), an odd head_dim, a table wider than the rotated dims; on
both backends (Triton through the interpreter), fp32 and fp16, forward and the gradients of q and k, against
PyTorch references (torch path bit-equal, Triton to tight tolerance)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama import modeling_llama
from transformers.models.phi3 import modeling_phi3
from transformers.models.pixtral import modeling_pixtral

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.rotary import rope_variant
from liger_registry.modules.rope import apply_rotary_pos_emb

B, HQ, HK, S = 2, 3, 1, 5
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}
DTYPES = [torch.float32, torch.float16]


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not triton_utils.INTERPRET_AT_IMPORT:
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _qk(d, dtype, seq_first=True):
    """q/k [B, H, S, d]; seq-first projections seen heads-first (every attention layer's transposed view)."""
    if seq_first:
        q = torch.randn(B, S, HQ, d, generator=_g(0)).to(dtype).transpose(1, 2)
        k = torch.randn(B, S, HK, d, generator=_g(1)).to(dtype).transpose(1, 2)
    else:
        q = torch.randn(B, HQ, S, d, generator=_g(0)).to(dtype)
        k = torch.randn(B, HK, S, d, generator=_g(1)).to(dtype)
    return q.requires_grad_(), k.requires_grad_()


def _table(shape, dtype, duplicated=False):
    """cos/sin of random angles; ``duplicated``: HF's layout, both halves of the last dim equal."""
    if duplicated:
        half = torch.randn(*shape[:-1], shape[-1] // 2, generator=_g(2)) * 3
        angle = torch.cat([half, half], -1)
    else:
        angle = torch.randn(*shape, generator=_g(2)) * 3
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
    gq = torch.randn(qo.shape, generator=_g(4)).to(qo.dtype)
    gk = torch.randn(ko.shape, generator=_g(5)).to(ko.dtype)
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
