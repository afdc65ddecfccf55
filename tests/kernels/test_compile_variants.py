"""The kernel variants (rope variants, fused gate_up activations, relu², add + RMSNorm, LayerNorm1P) compile with
``fullgraph=True`` on both backends, with the eager result and gradients."""

from __future__ import annotations

import pytest
import torch

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.glu import glu_fused, relu_squared, swiglu_clamped
from liger_registry.kernels.norm import add_rms_norm, layer_norm_1p
from liger_registry.kernels.rotary import rope_variant

B, H, S, D = 2, 4, 3, 8
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape, seed=0):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    return t.requires_grad_()


def _rope(**layout):
    def inputs():
        width = D // 2 if layout.get("cos_per_pair") else D
        cos, sin = torch.randn(1, S, width, device=DEVICE), torch.randn(1, S, width, device=DEVICE)
        # q and k as attention passes them: [B, S, heads, D] projections viewed heads-first
        q = _rand(B, S, H, D, seed=1).detach().transpose(1, 2).requires_grad_()
        k = _rand(B, S, 2, D, seed=2).detach().transpose(1, 2).requires_grad_()
        return (q, k, cos, sin), lambda q, k, cos, sin: rope_variant(q, k, cos, sin, **layout)

    return inputs


def _one(fn, *shape):
    return lambda: ((_rand(*shape),), fn)


def _add_rms(mode, offset):
    def inputs():
        args = (_rand(B, S, D), _rand(B, S, D, seed=1), _rand(D, seed=2))
        return args, lambda x, r, w: add_rms_norm(x, r, w, 1e-6, offset, mode)

    return inputs


def _ln1p():
    args = (_rand(B, S, D), _rand(D, seed=1), _rand(D, seed=2))
    return args, lambda x, w, b: layer_norm_1p(x, w, b, 1e-5)


VARIANTS = {
    "rope-partial": _rope(),
    "rope-interleaved-per-pair": _rope(interleaved=True, cos_per_pair=True),
    "rope-half-split": _rope(cos_per_pair=True),
    "rope-interleaved-upcast": _rope(interleaved=True, cos_per_pair=True, upcast=True),
    "glu-fused-swiglu": _one(lambda x: glu_fused(x, "swiglu"), B, S, 2 * D),
    "glu-fused-geglu": _one(lambda x: glu_fused(x, "geglu"), B, S, 2 * D),
    "swiglu-clamped": _one(lambda x: swiglu_clamped(x, 1.0, 1.702), B, S, 2 * D),
    "relu-squared": _one(relu_squared, B, S, D),
    "add-rms-norm-llama": _add_rms("llama", 0.0),
    "add-rms-norm-gemma": _add_rms("gemma", 1.0),
    "layer-norm-1p": _ln1p,
}


def _outputs_and_grads(fn, args):
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs))  # every output gets a gradient
    leaves = [a for a in args if a.requires_grad]
    return [o.detach() for o in outs], torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_compiles_without_graph_break(variant, backend, monkeypatch):
    if backend == "triton" and not (torch.cuda.is_available() or triton_utils.INTERPRET_AT_IMPORT):
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, backend)
    args, fn = VARIANTS[variant]()
    eager = _outputs_and_grads(fn, args)
    torch._dynamo.reset()
    compiled = _outputs_and_grads(torch.compile(fn, backend="aot_eager", fullgraph=True), args)
    for got, want in zip(compiled[0], eager[0], strict=True):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()  # the fakes' layouts are the kernels'
    for got, want in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(got, want)
