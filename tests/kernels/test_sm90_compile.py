"""Every Triton kernel, as the public ops launch it, compiles for Hopper (sm_90) and the row kernels that keep
per-lane state do not spill: checked on the CPU with Triton's own compiler (no GPU needed)."""

import pytest
import torch
from sm90_compile import compile_for_sm90, distinct, record_launches

from liger_registry import kernels as K
from liger_registry.kernels import glu, triton_utils
from liger_registry.kernels.ce import triton_kernels as ce_triton
from liger_registry.kernels.flce import triton_kernels as triton_flce_vocab
from liger_registry.kernels.loss_grads import BLOCK, _scale_unless_one_kernel
from liger_registry.kernels.norm import add_rms_norm
from liger_registry.kernels.rotary import rope_variant

pytestmark = pytest.mark.skipif(
    not triton_utils.INTERPRET_AT_IMPORT,
    reason="records the launches of the Triton interpreter (TRITON_INTERPRET=1 at import)",
)

# the row kernels whose statistics pass runs at ROW_STATS's block: a spill there costs them their speed
NO_SPILL = {"_ce_rows_kernel", "_stats_kernel"}


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _backward(*outs):
    loss = sum(o.float().sum() for o in outs if o is not None and o.requires_grad)
    loss.backward()


def _tour():
    """One fwd+bwd of each public op, with the widths the real models give the row kernels (4096 columns and
    more, so the block sizes are those of the GPU) and the flags that change a kernel's code."""
    x = torch.randn(3, 64, generator=_g(), requires_grad=True)
    w = torch.rand(64, generator=_g(1)).requires_grad_()
    _backward(K.rms_norm(x, w, 1e-6))
    _backward(K.rms_norm(x, w, 1e-6, offset=1.0, casting_mode="gemma"))
    _backward(K.layer_norm(x, w, torch.zeros(64, requires_grad=True), 1e-5))
    r = torch.randn(3, 64, requires_grad=True)
    _backward(*add_rms_norm(x, r, w, 1e-6))
    g = torch.randn(3, 96, generator=_g(2), requires_grad=True)
    u = torch.randn(3, 96, generator=_g(3), requires_grad=True)
    _backward(K.swiglu(g, u))
    _backward(K.geglu(g, u))
    gu = torch.randn(3, 192, generator=_g(4), requires_grad=True)
    _backward(glu.glu_fused(gu))
    _backward(glu.swiglu_clamped(gu, 7.0, 1.702))
    _backward(glu.relu_squared(g))
    q = torch.randn(1, 4, 5, 16, generator=_g(5), requires_grad=True)
    k = torch.randn(1, 2, 5, 16, generator=_g(6), requires_grad=True)
    cos, sin = torch.randn(1, 5, 16, generator=_g(7)), torch.randn(1, 5, 16, generator=_g(8))
    _backward(*K.rope(q, k, cos, sin))
    _backward(*rope_variant(q, k, cos[..., :8], sin[..., :8], interleaved=True, cos_per_pair=True))
    v = 40000  # > the widest block (32768): the row kernels loop over column blocks as on a real vocabulary
    logits = torch.randn(4, v, generator=_g(9), requires_grad=True)
    t = torch.randint(0, v, (4,), generator=_g(10))
    _backward(K.cross_entropy(logits, t))
    _backward(K.cross_entropy(logits, t, label_smoothing=0.1, softcap=20.0, lse_square_scale=1e-4))
    _backward(K.cross_entropy(logits, t, torch.rand(v, generator=_g(11))))
    h = torch.randn(6, 32, generator=_g(12), requires_grad=True)
    hw = torch.randn(v, 32, generator=_g(13), requires_grad=True)
    tt = torch.randint(0, v, (6,), generator=_g(14))
    for strategy in ("tokens", "vocab"):
        _backward(K.fused_linear_cross_entropy(h, hw, tt, strategy=strategy, max_chunk_mib=1))
        out = K.fused_linear_cross_entropy(
            h,
            hw,
            tt,
            strategy=strategy,
            max_chunk_mib=1,
            label_smoothing=0.1,
            softcap=30.0,
            return_token_accuracy=True,
        )
        _backward(out.loss)
    _backward(K.fused_linear_jsd(h, hw, h.detach(), hw.detach(), tt))
    h16, hw16 = h.detach().half().requires_grad_(), hw.detach().half().requires_grad_()
    _backward(K.fused_linear_cross_entropy(h16, hw16, tt, strategy="tokens"))  # the exact fp32 target logit
    t32 = torch.randn(300, generator=_g(15))
    _scale_unless_one_kernel[(2,)](t32, torch.tensor([0.5]), t32.numel(), BLOCK=BLOCK)  # CUDA-only caller


def test_every_launch_compiles_for_sm90_without_spills(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    with record_launches() as records:
        _tour()
        for kernel, (_, cap) in dict(ce_triton.ROW_STATS).items():  # the other statistics pass compiles too
            monkeypatch.setitem(ce_triton.ROW_STATS, kernel, ("blocks", cap))
        triton_flce_vocab._flags.cache_clear()
        _tour()
    triton_flce_vocab._flags.cache_clear()
    kernels = {r["kernel"] for r in records}
    assert NO_SPILL <= kernels, f"the tour did not reach {NO_SPILL - kernels}"
    results = compile_for_sm90(records)
    assert len(results) == len(distinct(records))
    failed = [f"{r['kernel']} {r['constexprs']}: {r['error']}" for r in results if r["error"]]
    assert not failed, "\n".join(failed)
    unread = [r["kernel"] for r in results if r["kernel"] in NO_SPILL and r["stack"] is None]
    assert not unread, f"no register report for {unread} (Triton's cuobjdump missing?)"
    spills = [
        f"{r['kernel']} BLOCK={r['constexprs'].get('BLOCK')} LANES={r['constexprs'].get('LANES')} stack "
        f"{r['stack']} B"
        for r in results
        if r["kernel"] in NO_SPILL and r["stack"]
    ]
    assert not spills, spills
