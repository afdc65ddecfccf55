"""The fused residual add + RMSNorm (kernels/norm) against the families' add-then-norm: the PyTorch path
bit-equal, Triton (the interpreter on CPU) to a tight tolerance, forward and every gradient, with and without a
weight; on CUDA, fp32 and bf16 against the families' norms in float64, and a whole bf16 decoder layer."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from cases import GPU_DTYPES, check_family, cuda_randn, finite_rel_err, g, gpu
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama
from transformers.models.qwen3_next import modeling_qwen3_next

from liger_registry.kernels.norm import add_rms_norm

ROWS, H, EPS = (
    13,
    40,
    1e-6,
)  # 13 rows over 4 backward programs (a ragged last one); 40 columns in a 64-wide block
ERRORS: dict[str, float] = {}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.float16]


def _compare(key, backend, ours, ref, dtype):
    tol = 0.0 if backend == "torch" else TOL[dtype]
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        if backend == "triton":
            rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
            ERRORS[key] = max(ERRORS.get(key, 0.0), rel)
        # atol scaled by the largest value: the weight gradient sums many half-precision products
        atol = tol * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=tol, atol=atol, msg=lambda m, i=i: f"tensor {i}: {m}")


NORMS = [
    (lambda: modeling_llama.LlamaRMSNorm(H, eps=1e-6), 0.0, "llama"),
    (lambda: modeling_gemma3.Gemma3RMSNorm(H, eps=1e-6), 1.0, "gemma"),
    (lambda: modeling_qwen3_next.Qwen3NextRMSNorm(H, eps=1e-6), 1.0, "gemma"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make,offset,mode", NORMS, ids=["LlamaRMSNorm", "Gemma3RMSNorm", "Qwen3NextRMSNorm"])
def test_add_rms_norm_matches_add_then_family_norm(backend, make, offset, mode, dtype):
    norm = make().to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(H, generator=g(0)) * 0.5)
    x = torch.randn(2, ROWS, H, generator=g(1)).to(dtype).requires_grad_()
    residual = (torch.randn(2, ROWS, H, generator=g(2)) * 3).to(dtype).requires_grad_()
    ref_s = residual + x
    ref_y = norm(ref_s)
    s, y = add_rms_norm(
        x, residual, norm.weight, norm.variance_epsilon if mode == "llama" else norm.eps, offset, mode
    )
    gs, gy = torch.randn(s.shape, generator=g(3)).to(dtype), torch.randn(y.shape, generator=g(4)).to(dtype)
    inputs = (x, residual, norm.weight)
    ref_grads = torch.autograd.grad((ref_s, ref_y), inputs, (gs, gy))
    grads = torch.autograd.grad((s, y), inputs, (gs, gy))
    _compare(
        f"add+{type(norm).__name__} {str(dtype)[6:]}",
        backend,
        (s, y, *grads),
        (ref_s, ref_y, *ref_grads),
        dtype,
    )


def test_add_rms_norm_one_output_used(backend):
    """Only the normalised output reaches the loss (a last layer), then only the sum (a norm skipped)."""
    norm = modeling_llama.LlamaRMSNorm(H)
    x = torch.randn(ROWS, H, generator=g(1)).requires_grad_()
    residual = torch.randn(ROWS, H, generator=g(2)).requires_grad_()
    for pick in (0, 1):
        ref = (residual + x, norm(residual + x))[pick]
        out = add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)[pick]
        gr = torch.randn(ref.shape, generator=g(5))
        ref_grads = torch.autograd.grad(ref, (x, residual, norm.weight), gr, allow_unused=True)
        grads = torch.autograd.grad(out, (x, residual, norm.weight), gr, allow_unused=True)
        if pick == 0:  # the weight is unused: no gradient (None) or a zero one
            assert grads[2] is None or not grads[2].any()
            ref_grads, grads = ref_grads[:2], grads[:2]
        _compare("add+LlamaRMSNorm one output", backend, grads, ref_grads, torch.float32)


def test_add_rms_norm_rejects_bad_inputs():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="casting_mode"):
        add_rms_norm(x, x, torch.ones(8), 1e-6, casting_mode="none")
    with pytest.raises(ValueError, match="differ"):
        add_rms_norm(x, torch.randn(3, 8), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        add_rms_norm(x, x, torch.ones(4), 1e-6)


def _x(dtype, seed=1, scale=3.0):
    """Rows with a stride larger than the row (the middle third of a wider buffer)."""
    return (torch.randn(ROWS, 3 * H, generator=g(seed)) * scale).to(dtype)[:, H : 2 * H].requires_grad_()


def _normalised(x):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["llama", "gemma"])
def test_add_rms_norm_without_weight(backend, mode, dtype):
    x, residual = _x(dtype), _x(dtype, seed=3, scale=1.0)
    s, y = add_rms_norm(x, residual, None, EPS, casting_mode=mode)
    ref_s = residual + x
    ref_y = _normalised(ref_s)
    gs, gy = (torch.randn(ROWS, H, generator=g(seed)).to(dtype) for seed in (4, 5))
    grads = torch.autograd.grad((s, y), (x, residual), (gs, gy))
    ref_grads = torch.autograd.grad((ref_s, ref_y), (x, residual), (gs, gy))
    for i, (a, b) in enumerate(zip((s, y, *grads), (ref_s, ref_y, *ref_grads), strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        tol = TOL[dtype] * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=tol, msg=lambda m, i=i: f"tensor {i}: {m}")


def test_zz_print_errors():
    """Prints the largest Triton-vs-family relative error of each case (run with -s)."""
    for key, err in sorted(ERRORS.items()):
        print(f"\n[add_rms_norm max rel err] {key}: {err:.3g}")


# ---------------------------------------------------------------- CUDA: against the families in float64
@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize(
    "make,offset,mode",
    [(modeling_llama.LlamaRMSNorm, 0.0, "llama"), (modeling_gemma3.Gemma3RMSNorm, 1.0, "gemma")],
    ids=["llama", "gemma3"],
)
@pytest.mark.usefixtures("auto_backend")
def test_add_rms_norm(make, offset, mode, dtype):
    h = 4096
    w = cuda_randn(h, seed=3, scale=0.3)

    def family(x, r, weight):
        norm = make(h).to(device="cuda", dtype=torch.float64)
        s = r + x
        return s, torch.func.functional_call(norm, {"weight": weight}, (s,))

    check_family(f"add_rms_norm {mode}", lambda x, r, weight: add_rms_norm(x, r, weight, 1e-6, offset, mode), family,
          [cuda_randn(4096, h, seed=0), cuda_randn(4096, h, seed=1, scale=3.0), w], dtype)  # fmt: skip


def _llama_layer_run(layer, x, config, go):
    """Output, input gradient and parameter gradients of one decoder layer on x (eager attention, no mask)."""
    x = x.detach().to(next(layer.parameters()).dtype).requires_grad_(True)
    position_ids = torch.arange(x.shape[1], device="cuda")[None]
    embeddings = modeling_llama.LlamaRotaryEmbedding(config).to("cuda")(x, position_ids)
    out = layer(x, position_embeddings=embeddings, position_ids=position_ids)
    out.backward(go.to(out.dtype))
    return [out, x.grad, *(p.grad for _, p in sorted(layer.named_parameters()))]


@gpu
@pytest.mark.usefixtures("auto_backend")
def test_add_rms_norm_decoder_layer_bf16_as_close_as_eager():
    """The fused layer forward in bf16 (Triton) is no further from the float64 layer than the eager bf16 layer."""
    from liger_registry.modules.add_rms_norm import add_rms_norm_layer_forward
    from liger_registry.schemas import AddRmsNormSpec

    config = modeling_llama.LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=4, head_dim=128
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    master = modeling_llama.LlamaDecoderLayer(config, layer_idx=0).to("cuda")
    with torch.no_grad():
        for p in master.parameters():
            p.normal_(0.0 if p.ndim > 1 else 1.0, 0.02 if p.ndim > 1 else 0.3)
    x, go = cuda_randn(2, 512, 1024, seed=0), cuda_randn(2, 512, 1024, seed=1)
    ref = _llama_layer_run(copy.deepcopy(master).double(), x, config, go)
    eager = _llama_layer_run(copy.deepcopy(master).bfloat16(), x, config, go)
    fused = copy.deepcopy(master).bfloat16()
    fused.forward = types.MethodType(
        add_rms_norm_layer_forward(AddRmsNormSpec(targets=["LlamaDecoderLayer"])), fused
    )
    ours = _llama_layer_run(fused, x, config, go)
    for i, (o, e, r) in enumerate(zip(ours, eager, ref, strict=True)):
        err, eager_err = finite_rel_err(o, r), finite_rel_err(e, r)
        print(
            f"[gpu-variant] add_rms_norm layer tensor{i} bf16 rel_err={err:.2e} eager={eager_err:.2e}",
            flush=True,
        )
        assert err <= 1.5 * eager_err + 1e-3, f"tensor {i}: {err:.3e} vs eager {eager_err:.3e}"
