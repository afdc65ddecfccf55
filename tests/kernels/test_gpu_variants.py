"""GPU checks of the issue-12 kernel variants (skipped without CUDA): bf16 and fp32 Triton against the families'
own functions in float64, forward and gradients. Error per tensor: ||out - ref|| / ||ref||.

    LIGER_REGISTRY_BACKEND=auto python -m pytest -q -s tests/kernels/test_gpu_variants.py
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
from kernel_refs import bits_apart
from transformers.activations import ACT2FN
from transformers.integrations.moe import _default_apply_gate
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.glm4 import modeling_glm4
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama import modeling_llama
from transformers.models.nemotron import modeling_nemotron
from transformers.models.phi3 import modeling_phi3
from transformers.models.qwen3_next import modeling_qwen3_next

from liger_registry.kernels import OPS
from liger_registry.kernels.glu import glu_fused, relu_squared, swiglu_clamped
from liger_registry.kernels.glu.reference import glu_fused_torch
from liger_registry.kernels.norm import add_rms_norm, layer_norm_1p
from liger_registry.kernels.rotary import rope_variant_torch
from liger_registry.modules import rope as dropin

DEVICE = "cuda"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16]
B, HQ, HK, S = 2, 32, 8, 512  # rope
N, INTER, HIDDEN = 4096, 8192, 4096  # rows, intermediate size, hidden size


@pytest.fixture(autouse=True)
def _auto(monkeypatch):
    monkeypatch.setenv("LIGER_REGISTRY_BACKEND", "auto")


def _rel(out, ref) -> float:
    out64, ref64 = out.detach().double(), ref.detach().double()
    assert torch.isfinite(out64).all()
    den = ref64.norm().item()
    return (out64 - ref64).norm().item() / (den if den > 0 else 1.0)


def check(case, ours, family, masters, dtype, *, n_grad=None):
    """Run ``ours`` on ``dtype`` copies of ``masters`` and ``family`` on float64 copies; compare the outputs
    and the gradients of the first ``n_grad`` inputs (all by default)."""
    n_grad = len(masters) if n_grad is None else n_grad
    a = [m.detach().to(dtype).requires_grad_(i < n_grad) for i, m in enumerate(masters)]
    r = [m.detach().to(dtype).double().requires_grad_(i < n_grad) for i, m in enumerate(masters)]
    out, ref = ours(*a), family(*r)
    out, ref = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    gos = [torch.randn(o.shape, device=DEVICE, generator=gen) for o in ref]
    grads = torch.autograd.grad(out, a[:n_grad], [g.to(o.dtype) for g, o in zip(gos, out, strict=True)])
    ref_grads = torch.autograd.grad(ref, r[:n_grad], [g.double() for g in gos])
    for i, (o, e) in enumerate(zip((*out, *grads), (*ref, *ref_grads), strict=True)):
        err = _rel(o, e)
        print(
            f"[gpu-variant] {case} tensor{i} {str(dtype)[6:]} rel_err={err:.2e} bound={TOL[dtype]:.0e}",
            flush=True,
        )
        assert err <= TOL[dtype], f"{case} tensor {i}: {err:.3e}"


def _randn(*shape, seed=0, scale=1.0):
    return (
        torch.randn(*shape, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(seed)) * scale
    )


def test_variants_run_triton_on_cuda():
    x = torch.randn(4, 8, device=DEVICE, dtype=torch.bfloat16)
    ops = ("rope_variant", "glu_fused", "swiglu_clamped", "relu_squared", "add_rms_norm")
    assert all(OPS[op].decide(x)[0] == "triton" for op in ops)


ROPE = [  # family function, drop-in, head dim, cos width
    (modeling_phi3.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, 128, 96),
    (modeling_qwen3_next.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_partial, 256, 64),
    (modeling_glm4.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_interleaved, 128, 64),
    (modeling_gpt_oss.apply_rotary_pos_emb, dropin.apply_rotary_pos_emb_half_split, 64, 32),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family,ours,d,width", ROPE, ids=["phi3", "qwen3_next", "glm4", "gpt_oss"])
def test_rope_variant(family, ours, d, width, dtype):
    angle = _randn(B, S, width, seed=2, scale=3.0)
    masters = [_randn(B, HQ, S, d, seed=0), _randn(B, HK, S, d, seed=1), angle.cos(), angle.sin()]
    check(f"rope {family.__module__.rsplit('.', 1)[-1]}", ours, family, masters, dtype, n_grad=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_llama4_complex(dtype):
    angle = _randn(B, S, 64, seed=2, scale=3.0)
    freqs = torch.polar(torch.ones_like(angle), angle)

    def ours(q, k):
        return dropin.apply_rotary_emb(q, k, freqs)

    def family(q, k):  # llama4's own function upcasts to fp32: the float64 reference is the same product
        qo, ko = rope_variant_torch(q.transpose(1, 2), k.transpose(1, 2), angle.cos().double(), angle.sin().double(),
                                    interleaved=True, cos_per_pair=True)  # fmt: skip
        return qo.transpose(1, 2), ko.transpose(1, 2)

    check("rope llama4", ours, family, [_randn(B, S, HQ, 128, seed=0), _randn(B, S, HK, 128, seed=1)], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_glu_fused(kind, dtype):
    check(f"glu_fused {kind}", lambda gu: glu_fused(gu, kind), lambda gu: glu_fused_torch(gu, kind),
          [_randn(N, 2 * INTER, scale=2.0)], dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_clamped(dtype):
    experts = types.SimpleNamespace(limit=7.0, alpha=1.702)
    check("swiglu_clamped gpt_oss", lambda gu: swiglu_clamped(gu, 7.0, 1.702),
          lambda gu: modeling_gpt_oss.GptOssExperts._apply_gate(experts, gu),
          [_randn(N, 2 * INTER, scale=4.0)], dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_relu_squared(dtype):
    check("relu2 nemotron", relu_squared, ACT2FN["relu2"], [_randn(N, INTER)], dtype)


# bf16 bits against the family code: the activation's last fp32 bit may differ between Triton and CUDA now
# and then (a 1-ulp flip of a rounded intermediate); where each op rounds is the same. GPT-OSS's gate rounds
# five times, so one flipped sigmoid may move its result by a few ulps.
BITS_MAX_DIFFERING = 2e-3


def bits_check(case, ours, family, gate_up, max_ulps=1):
    out, ref = ours(gate_up), family(gate_up)
    assert out.dtype == ref.dtype == torch.bfloat16 and out.shape == ref.shape
    ulps, differing = bits_apart(out, ref)
    print(f"[gpu-bits] {case} max_ulps={ulps} differing={differing:.2e}", flush=True)
    assert ulps <= max_ulps and differing <= BITS_MAX_DIFFERING, (
        f"{case}: {ulps} ulps, {differing:.2e} differ"
    )


@pytest.mark.parametrize("kind,act", [("swiglu", "silu"), ("geglu", "gelu_pytorch_tanh")])
def test_glu_fused_bf16_bits_as_phi3_and_experts(kind, act):
    experts = types.SimpleNamespace(act_fn=ACT2FN[act])
    gate = _randn(N, INTER, scale=3.0)
    if kind == "geglu":  # below -3 torch's own 1 + tanh(.) cancels: its last bits are those of CUDA's tanhf
        gate = gate.clamp(min=-3.0)
    gate_up = torch.cat([gate, _randn(N, INTER, seed=1, scale=4.0)], -1).bfloat16()
    bits_check(f"glu_fused {kind}", lambda gu: glu_fused(gu, kind), lambda gu: _default_apply_gate(experts, gu),
               gate_up)  # fmt: skip


def test_swiglu_clamped_bf16_bits_as_gpt_oss():
    experts = types.SimpleNamespace(limit=7.0, alpha=1.702)
    bits_check("swiglu_clamped", lambda gu: swiglu_clamped(gu, 7.0, 1.702),
               lambda gu: modeling_gpt_oss.GptOssExperts._apply_gate(experts, gu),
               _randn(N, 2 * INTER, scale=4.0).bfloat16(), max_ulps=4)  # fmt: skip


def test_relu_squared_bf16_bits_as_nemotron():
    bits_check("relu2", relu_squared, ACT2FN["relu2"], _randn(N, INTER, scale=30.0).bfloat16())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "make,offset,mode",
    [(modeling_llama.LlamaRMSNorm, 0.0, "llama"), (modeling_gemma3.Gemma3RMSNorm, 1.0, "gemma")],
    ids=["llama", "gemma3"],
)
def test_add_rms_norm(make, offset, mode, dtype):
    h = HIDDEN
    w = _randn(h, seed=3, scale=0.3)

    def family(x, r, weight):
        norm = make(h).to(device=DEVICE, dtype=torch.float64)
        s = r + x
        return s, torch.func.functional_call(norm, {"weight": weight}, (s,))

    check(f"add_rms_norm {mode}", lambda x, r, weight: add_rms_norm(x, r, weight, 1e-6, offset, mode), family,
          [_randn(N, h, seed=0), _randn(N, h, seed=1, scale=3.0), w], dtype)  # fmt: skip


def _llama_layer_run(layer, x, config, go):
    """Output, input gradient and parameter gradients of one decoder layer on x (eager attention, no mask)."""
    x = x.detach().to(next(layer.parameters()).dtype).requires_grad_(True)
    position_ids = torch.arange(x.shape[1], device=DEVICE)[None]
    embeddings = modeling_llama.LlamaRotaryEmbedding(config).to(DEVICE)(x, position_ids)
    out = layer(x, position_embeddings=embeddings, position_ids=position_ids)
    out.backward(go.to(out.dtype))
    return [out, x.grad, *(p.grad for _, p in sorted(layer.named_parameters()))]


def test_add_rms_norm_decoder_layer_bf16_as_close_as_eager():
    """The fused layer forward in bf16 (Triton) is no further from the float64 layer than the eager bf16 layer."""
    from liger_registry.modules.add_rms_norm import add_rms_norm_layer_forward
    from liger_registry.schemas import AddRmsNormSpec

    config = modeling_llama.LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=4, head_dim=128
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    master = modeling_llama.LlamaDecoderLayer(config, layer_idx=0).to(DEVICE)
    with torch.no_grad():
        for p in master.parameters():
            p.normal_(0.0 if p.ndim > 1 else 1.0, 0.02 if p.ndim > 1 else 0.3)
    x, go = _randn(2, 512, 1024, seed=0), _randn(2, 512, 1024, seed=1)
    ref = _llama_layer_run(copy.deepcopy(master).double(), x, config, go)
    eager = _llama_layer_run(copy.deepcopy(master).bfloat16(), x, config, go)
    fused = copy.deepcopy(master).bfloat16()
    fused.forward = types.MethodType(
        add_rms_norm_layer_forward(AddRmsNormSpec(targets=["LlamaDecoderLayer"])), fused
    )
    ours = _llama_layer_run(fused, x, config, go)
    for i, (o, e, r) in enumerate(zip(ours, eager, ref, strict=True)):
        err, eager_err = _rel(o, r), _rel(e, r)
        print(
            f"[gpu-variant] add_rms_norm layer tensor{i} bf16 rel_err={err:.2e} eager={eager_err:.2e}",
            flush=True,
        )
        assert err <= 1.5 * eager_err + 1e-3, f"tensor {i}: {err:.3e} vs eager {eager_err:.3e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm_1p(dtype):
    h = HIDDEN

    def family(x, weight, bias):
        norm = modeling_nemotron.NemotronLayerNorm1P(h).to(device=DEVICE, dtype=torch.float64)
        return torch.func.functional_call(norm, {"weight": weight, "bias": bias}, (x,))

    check("layer_norm_1p nemotron", lambda x, weight, bias: layer_norm_1p(x, weight, bias, 1e-5), family,
          [_randn(N, h, seed=0, scale=2.0), _randn(h, seed=1, scale=0.1), _randn(h, seed=2, scale=0.1)], dtype)  # fmt: skip
