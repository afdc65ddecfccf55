"""RoPE variants (kernels/rope rope_variant: partial, interleaved, half-split, llama4's complex product) against
the families' own functions: the PyTorch path bit-equal, Triton (the interpreter on CPU) to a tight tolerance,
forward and the gradients of q and k; on CUDA, fp32 and bf16 against the families' functions in float64."""

from __future__ import annotations

import pytest
import torch
from cases import GPU_DTYPES, check_family, cuda_randn, g, gpu, needs_interpreter, rope_variant_torch
from transformers.models.glm import modeling_glm
from transformers.models.glm4 import modeling_glm4
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama4 import modeling_llama4
from transformers.models.nemotron import modeling_nemotron
from transformers.models.phi3 import modeling_phi3
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_next import modeling_qwen3_next

from liger_registry import kernels as K
from liger_registry.kernels.rotary import rope_variant
from liger_registry.modules import rope as dropin
from liger_registry.registry.targets import hub_wrapped_function

B, HQ, HK, S, D = 2, 3, 1, 5, 24  # odd head counts, half dims 6 and 12: every block has a masked tail

# family function, our drop-in, cos width given head_dim (None: llama4's complex freqs_cis)
PARTIAL = [
    (modeling_phi3.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, D // 2),
    (modeling_nemotron.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, D // 2),
    (modeling_qwen3_next.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, D // 4),
    (modeling_qwen3_5.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, D),
    (modeling_glm4.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_interleaved, D // 2),
    (modeling_glm.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_interleaved, D),
    (modeling_gpt_oss.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_half_split, D // 2),
]
CASES = [*PARTIAL, (modeling_llama4.apply_rotary_emb, dropin.apply_rotary_emb, None)]
IDS = ["phi3", "nemotron", "qwen3_next", "qwen3_5", "glm4", "glm", "gpt_oss", "llama4"]
ONE_PER_LAYOUT = (2, 4, 6, 7)  # qwen3_next (partial), glm4 (interleaved), gpt_oss (half split), llama4
ERRORS: dict[str, float] = {}


def _inputs(cos_width, dtype, cos_dtype, seq_first=False, cos_batch=B):
    shape_q, shape_k = (
        ((B, S, HQ, D), (B, S, HK, D)) if seq_first or cos_width is None else ((B, HQ, S, D), (B, HK, S, D))
    )
    q = torch.randn(*shape_q, generator=g(0)).to(dtype).requires_grad_()
    k = torch.randn(*shape_k, generator=g(1)).to(dtype).requires_grad_()
    if cos_width is None:
        angle = torch.randn(cos_batch, S, D // 2, generator=g(2)) * 3
        return q, k, (torch.polar(torch.ones_like(angle), angle),)
    cos = torch.randn(cos_batch, S, cos_width, generator=g(2)).to(cos_dtype)
    sin = torch.randn(cos_batch, S, cos_width, generator=g(3)).to(cos_dtype)
    return q, k, (cos, sin)


def _run(fn, q, k, rest, seq_first):
    kwargs = {"unsqueeze_dim": 2} if seq_first else {}
    qo, ko = fn(q, k, *rest, **kwargs)
    gq, gk = (
        torch.randn(qo.shape, generator=g(4)).to(qo.dtype),
        torch.randn(ko.shape, generator=g(5)).to(ko.dtype),
    )
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    return qo, ko, dq, dk


def _compare(family, ours, q, k, rest, seq_first, tol, key=None):
    ref = _run(family, q, k, rest, seq_first)
    out = _run(ours, q, k, rest, seq_first)
    for name, a, b in zip(("q", "k", "dq", "dk"), out, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if key:
            ERRORS[key] = max(ERRORS.get(key, 0.0), (a.float() - b.float()).abs().max().item())
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


DTYPES = [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.float16, torch.float32)]


@pytest.mark.parametrize("dtype,cos_dtype", DTYPES + [(torch.bfloat16, torch.bfloat16)], ids=str)
@pytest.mark.parametrize("family,ours,width", CASES, ids=IDS)
def test_torch_path_is_bit_equal(monkeypatch, family, ours, width, dtype, cos_dtype):
    monkeypatch.setenv(K.ENV_VAR, "torch")
    q, k, rest = _inputs(width, dtype, cos_dtype)
    _compare(family, ours, q, k, rest, False, 0.0)


def test_torch_path_seq_first_and_broadcast_cos(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "torch")
    for family, ours, width in PARTIAL:
        q, k, rest = _inputs(width, torch.float32, torch.float32, seq_first=True, cos_batch=1)
        _compare(family, ours, q, k, rest, True, 0.0)


TOL = {torch.float32: 1e-5, torch.float16: 4e-3}


@needs_interpreter
@pytest.mark.parametrize("dtype,cos_dtype", DTYPES[:2], ids=str)
@pytest.mark.parametrize("family,ours,width", CASES, ids=IDS)
def test_triton_matches_family(monkeypatch, family, ours, width, dtype, cos_dtype):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    q, k, rest = _inputs(width, dtype, cos_dtype)
    named = hub_wrapped_function(family)  # transformers >= 5.25 with `kernels`: a module around the function
    key = f"{named.__module__.rsplit('.', 1)[-1]}.{named.__name__} {str(dtype)[6:]}/{str(cos_dtype)[6:]}"
    _compare(family, ours, q, k, rest, False, TOL[dtype], key)


@needs_interpreter
@pytest.mark.parametrize(
    "family,ours,width", [CASES[i] for i in ONE_PER_LAYOUT], ids=[IDS[i] for i in ONE_PER_LAYOUT]
)
def test_triton_fp16_q_fp32_cos(monkeypatch, family, ours, width):
    """fp16 q/k rotated by fp32 cos/sin: fp32 results, fp16 gradients (one family per layout)."""
    test_triton_matches_family(monkeypatch, family, ours, width, torch.float16, torch.float32)


@needs_interpreter
@pytest.mark.parametrize(
    "family,ours,width", [PARTIAL[i] for i in ONE_PER_LAYOUT[:-1]], ids=[IDS[i] for i in ONE_PER_LAYOUT[:-1]]
)
def test_triton_seq_first_and_broadcast_cos(monkeypatch, family, ours, width):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    q, k, rest = _inputs(width, torch.float32, torch.float32, seq_first=True, cos_batch=1)
    _compare(family, ours, q, k, rest, True, TOL[torch.float32])
    qo, _ = ours(q, k, *rest, unsqueeze_dim=2)
    assert qo.is_contiguous()  # the seq-first result keeps q's layout


@needs_interpreter
def test_triton_only_one_output_used(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    q, k, (cos, sin) = _inputs(D // 2, torch.float32, torch.float32)
    qo, _ = rope_variant(q, k, cos, sin)
    (dq,) = torch.autograd.grad(qo.sum(), q)
    ref_q, _ = modeling_phi3.apply_rotary_pos_emb(q, k, cos, sin)
    (ref_dq,) = torch.autograd.grad(ref_q.sum(), q)
    torch.testing.assert_close(dq, ref_dq)


def test_rejects_bad_shapes():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="rotary dim 10"):
        rope_variant(q, k, torch.randn(1, 3, 10), torch.randn(1, 3, 10))
    with pytest.raises(ValueError, match="rotary dim 3"):  # 3 cos per element: odd
        rope_variant(q, k, torch.randn(1, 3, 3), torch.randn(1, 3, 3))
    with pytest.raises(ValueError, match="rotary dim 10"):  # 5 cos per pair: 10 > 8
        rope_variant(q, k, torch.randn(1, 3, 5), torch.randn(1, 3, 5), cos_per_pair=True)
    with pytest.raises(ValueError, match="does not match"):
        rope_variant(q, k, torch.randn(2, 3, 8), torch.randn(2, 3, 8))


def test_zz_print_errors():
    """Prints the largest Triton-vs-family error of each case (run with -s); the bounds are asserted above."""
    for key, err in sorted(ERRORS.items()):
        print(f"[rope-variant max abs err] {key}: {err:.3g}")


# ---------------------------------------------------------------- CUDA: against the families in float64
GB, GHQ, GHK, GS = 2, 32, 8, 512
ROPE = [  # family function, drop-in, head dim, cos width
    (modeling_phi3.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, 128, 96),
    (modeling_qwen3_next.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, 256, 64),
    (modeling_glm4.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_interleaved, 128, 64),
    (modeling_gpt_oss.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_half_split, 64, 32),
]


@gpu
@pytest.mark.usefixtures("auto_backend")
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("family,ours,d,width", ROPE, ids=["phi3", "qwen3_next", "glm4", "gpt_oss"])
def test_rope_variant(family, ours, d, width, dtype):
    angle = cuda_randn(GB, GS, width, seed=2, scale=3.0)
    masters = [
        cuda_randn(GB, GHQ, GS, d, seed=0),
        cuda_randn(GB, GHK, GS, d, seed=1),
        angle.cos(),
        angle.sin(),
    ]
    check_family(f"rope {family.__module__.rsplit('.', 1)[-1]}", ours, family, masters, dtype, n_grad=2)


@gpu
@pytest.mark.usefixtures("auto_backend")
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_rope_llama4_complex(dtype):
    angle = cuda_randn(GB, GS, 64, seed=2, scale=3.0)
    freqs = torch.polar(torch.ones_like(angle), angle)

    def ours(q, k):
        return dropin.apply_rotary_emb(q, k, freqs)

    def family(q, k):  # llama4's own function upcasts to fp32: the float64 reference is the same product
        qo, ko = rope_variant_torch(q.transpose(1, 2), k.transpose(1, 2), angle.cos().double(), angle.sin().double(),
                                    interleaved=True, cos_per_pair=True)  # fmt: skip
        return qo.transpose(1, 2), ko.transpose(1, 2)

    masters = [cuda_randn(GB, GS, GHQ, 128, seed=0), cuda_randn(GB, GS, GHK, 128, seed=1)]
    check_family("rope llama4", ours, family, masters, dtype)
