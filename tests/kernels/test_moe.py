"""MoE experts (kernels/moe) against a per-token PyTorch reference: both backends (Triton through the interpreter
on CPU), every gate, both weight layouts, biases, an expert without tokens, fp32 forward and every gradient;
separate gate and up weights and a down weight that is a transposed view (DBRX) against the fused equivalent;
the routing table's blocks; argument errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cases import gpu, moe_kernels, moe_ops, moe_tuning
from cases import moe_route as route

from liger_registry import kernels as K
from liger_registry.kernels.moe import moe_experts

T, H, INTER, E, TOP_K = 37, 24, 20, 5, 2
LIMIT, ALPHA = 1.5, 1.702


def _gate(gu: torch.Tensor, act: str) -> torch.Tensor:
    if act == "clamped_swiglu":
        g, u = gu[::2].clamp(max=LIMIT), gu[1::2].clamp(-LIMIT, LIMIT)
        return (u + 1) * g * torch.sigmoid(g * ALPHA)
    g, u = gu.chunk(2)
    if act == "limited_swiglu":
        return F.silu(g.clamp(max=LIMIT)) * u.clamp(-LIMIT, LIMIT)
    return (F.silu(g) if act == "swiglu" else F.gelu(g, approximate="tanh")) * u


def reference(x, idx, w, w_gu, w_d, b_gu, b_d, act, transposed):
    """Token by token, slot by slot: what every experts implementation computes."""
    rows = []
    for t in range(x.shape[0]):
        acc = torch.zeros_like(x[t])
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            gu = x[t] @ (w_gu[e] if transposed else w_gu[e].t())
            gu = gu if b_gu is None else gu + b_gu[e]
            y = _gate(gu, act) @ (w_d[e] if transposed else w_d[e].t())
            acc = acc + w[t, k] * (y if b_d is None else y + b_d[e])
        rows.append(acc)
    return torch.stack(rows)


def _inputs(act: str, transposed: bool, bias: bool, idle_expert: int | None = 3, seed: int = 0, inter=INTER):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).requires_grad_()
    idx = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(T)])
    if idle_expert is not None:
        idx[idx == idle_expert] = (idle_expert + 1) % E
    w = torch.rand(T, TOP_K, generator=g).requires_grad_()
    gu_shape, d_shape = (
        ((E, H, 2 * inter), (E, inter, H)) if transposed else ((E, 2 * inter, H), (E, H, inter))
    )
    w_gu = (torch.randn(gu_shape, generator=g) * 0.2).requires_grad_()
    w_d = (torch.randn(d_shape, generator=g) * 0.2).requires_grad_()
    b_gu = (torch.randn(E, 2 * inter, generator=g) * 0.1).requires_grad_() if bias else None
    b_d = (torch.randn(E, H, generator=g) * 0.1).requires_grad_() if bias else None
    return x, idx, w, w_gu, w_d, b_gu, b_d


CASES = [
    ("swiglu", False, False),
    ("geglu", False, False),
    ("swiglu", True, True),
    ("clamped_swiglu", True, True),  # GPT-OSS: interleaved pairs, transposed weights, biases
    ("clamped_swiglu", False, False),
    ("limited_swiglu", False, False),  # DeepSeek-V4: the split SwiGLU, gate and up clamped at the limit
    ("limited_swiglu", True, True),
]


@pytest.mark.parametrize(("act", "transposed", "bias"), CASES)
def test_forward_and_gradients_match_the_reference(backend, act, transposed, bias):
    x, idx, w, w_gu, w_d, b_gu, b_d = _inputs(act, transposed, bias)
    out = moe_experts(
        x, idx, w, w_gu, w_d, b_gu, b_d, act=act, limit=LIMIT, alpha=ALPHA, transposed=transposed
    )
    want = reference(x, idx, w, w_gu, w_d, b_gu, b_d, act, transposed)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    params = [p for p in (x, w, w_gu, w_d, b_gu, b_d) if p is not None]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(out, params, dy)
    ref = torch.autograd.grad(want, params, dy)
    for name, a, b in zip(("x", "w", "w_gu", "w_d", "b_gu", "b_d"), got, ref, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"d {name}: {m}")
    assert not w_gu.grad_fn and got[2][3].abs().sum() == 0, "the idle expert's weight gradient must be zero"


@pytest.mark.parametrize(
    ("act", "transposed", "bias"), [("swiglu", False, True), ("clamped_swiglu", True, True)]
)
def test_weight_gradients_by_grouped_mm_match_the_reference(backend, act, transposed, bias, monkeypatch):
    """The weight gradients as torch._grouped_mm (chosen on CUDA), forced here on the CPU's grouped GEMM."""
    if backend != "triton":
        pytest.skip("the grouped-GEMM weight gradients are a choice of the Triton path")
    monkeypatch.setattr(moe_ops, "wgrad_by_grouped_mm", lambda x, h: True)
    x, idx, w, w_gu, w_d, b_gu, b_d = _inputs(act, transposed, bias)
    kw = dict(act=act, limit=LIMIT, alpha=ALPHA, transposed=transposed)
    out = moe_experts(x, idx, w, w_gu, w_d, b_gu, b_d, **kw)
    want = reference(x, idx, w, w_gu, w_d, b_gu, b_d, act, transposed)
    params = [w_gu, w_d, b_gu, b_d]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    for name, a, b in zip(
        ("w_gu", "w_d", "b_gu", "b_d"),
        torch.autograd.grad(out, params, dy),
        torch.autograd.grad(want, params, dy),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"d {name}: {m}")


def _split_inputs(act: str, transposed: bool, bias: bool, down_view: bool):
    """Separate gate and up weights (leaves) and their fused equivalent (their cat, so gradients reach them);
    ``down_view``: the down weight stored [E, I, H] and passed as its transposed view (DBRX's w2)."""
    x, idx, w, w_gu, w_d, b_gu, b_d = _inputs(act, transposed, bias)
    dim = 2 if transposed else 1
    w_g, w_u = (half.detach().contiguous().requires_grad_() for half in w_gu.chunk(2, dim))
    if down_view:
        w_d = w_d.detach().transpose(1, 2).contiguous().requires_grad_()  # the stored [E, I, H]
    return x, idx, w, (w_g, w_u), w_d, b_gu, b_d, dim


@pytest.mark.parametrize(
    ("act", "transposed", "bias", "down_view"),
    [
        ("swiglu", False, False, True),  # DBRX
        ("swiglu", False, True, False),
        ("geglu", True, False, False),
        ("limited_swiglu", True, True, False),
        ("swiglu", True, True, False),
    ],
)
def test_split_gate_and_up_weights_match_the_fused_equivalent(backend, act, transposed, bias, down_view):
    """up_proj beside a gate-only gate_up_proj computes what their cat computes: the output and every gradient,
    fp32, whichever way the down weight is stored."""
    x, idx, w, (w_g, w_u), w_d, b_gu, b_d, dim = _split_inputs(act, transposed, bias, down_view)
    down = w_d.transpose(1, 2) if down_view else w_d
    kw = dict(act=act, limit=LIMIT, alpha=ALPHA, transposed=transposed)
    got = moe_experts(x, idx, w, w_g, down, b_gu, b_d, up_proj=w_u, **kw)
    want = moe_experts(x, idx, w, torch.cat([w_g, w_u], dim), down.contiguous(), b_gu, b_d, **kw)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    params = [p for p in (x, w, w_g, w_u, w_d, b_gu, b_d) if p is not None]
    dy = torch.randn(got.shape, generator=torch.Generator().manual_seed(9))
    named = zip("x w w_g w_u w_d b_gu b_d".split(), (x, w, w_g, w_u, w_d, b_gu, b_d), strict=True)
    names = [n for n, p in named if p is not None]
    for name, a, b in zip(
        names, torch.autograd.grad(got, params, dy), torch.autograd.grad(want, params, dy), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"d {name}: {m}")


@pytest.mark.parametrize(("transposed", "bias", "down_view"), [(False, False, True), (True, True, False)])
def test_split_weight_gradients_by_grouped_mm_match_the_fused_equivalent(
    backend, transposed, bias, down_view, monkeypatch
):
    """The grouped-GEMM weight gradients (forced on the CPU's torch._grouped_mm) of separate gate and up
    weights, and of a down weight that is a transposed view: those of the fused equivalent."""
    if backend != "triton":
        pytest.skip("the grouped-GEMM weight gradients are a choice of the Triton path")
    monkeypatch.setattr(moe_ops, "wgrad_by_grouped_mm", lambda x, h: True)
    x, idx, w, (w_g, w_u), w_d, b_gu, b_d, dim = _split_inputs("swiglu", transposed, bias, down_view)
    down = w_d.transpose(1, 2) if down_view else w_d
    kw = dict(transposed=transposed)
    got = moe_experts(x, idx, w, w_g, down, b_gu, b_d, up_proj=w_u, **kw)
    want = reference(x, idx, w, torch.cat([w_g, w_u], dim), down, b_gu, b_d, "swiglu", transposed)
    params = [p for p in (w_g, w_u, w_d, b_gu, b_d) if p is not None]
    dy = torch.randn(got.shape, generator=torch.Generator().manual_seed(9))
    for a, b in zip(torch.autograd.grad(got, params, dy), torch.autograd.grad(want, params, dy), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("inter", [INTER, 45])  # one and three column blocks (the interpreter's 16 wide)
def test_glu_backward_pass_writes_the_gathered_weighted_rows(backend, inter):
    """GLU_BWD's copy: every sorted row's incoming gradient times its routing weight, written once (by the first
    column block) however many column blocks the launch has; other modes refuse it."""
    if backend != "triton":
        pytest.skip("a Triton launch")
    tk = moe_kernels
    x, idx, w, w_gu, w_d, _, _ = _inputs("swiglu", False, False, inter=inter)
    table = route(idx, E)
    n_rows = table.src.shape[0]
    dout = torch.randn(T, H, generator=torch.Generator().manual_seed(3))
    weights = w.detach().reshape(-1)[table.dest.long()]
    gate_up = torch.randn(n_rows, 2 * inter, generator=torch.Generator().manual_seed(4))
    copy = torch.full((n_rows, H), float("nan"))
    part = torch.zeros(tk.col_blocks(inter), n_rows)
    tk.rows_gemm(tk.GLU_BWD, dout, table.src, w_d.detach(), False, inter, table, out=torch.empty_like(gate_up),
                 weights=weights, aux=gate_up, part=part, copy=copy)  # fmt: skip
    torch.testing.assert_close(copy, dout[table.src.long()] * weights[:, None], rtol=0, atol=0)
    with pytest.raises(ValueError, match="GLU_BWD mode only"):
        tk.rows_gemm(tk.SCATTER, gate_up, None, w_gu.detach(), True, H, table, out=copy, copy=copy)


def test_grouped_mm_is_chosen_only_on_cuda_with_aligned_rows():
    x, h = torch.zeros(4, 24), torch.zeros(4, 20)
    assert not moe_ops.wgrad_by_grouped_mm(x, h)


def test_strided_hidden_rows_and_fp32_routing_weights_with_half_activations(backend):
    """Hidden states whose rows are a slice of a wider buffer; fp16 activations with fp32 routing weights (the
    product is promoted, as transformers' experts promote it)."""
    if backend == "triton":
        dtype = torch.float16
    else:
        dtype = torch.float32
    x, idx, w, w_gu, w_d, _, _ = _inputs("swiglu", False, False)
    wide = torch.randn(T, 2 * H).to(dtype)
    xs = wide[:, :H]
    args = (idx, w.detach(), w_gu.detach().to(dtype), w_d.detach().to(dtype))
    out = moe_experts(xs, *args)
    want = reference(xs.float(), idx, w.detach(), w_gu.detach(), w_d.detach(), None, None, "swiglu", False)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


def test_routing_table_covers_every_row_once_with_idle_blocks_last():
    idx = torch.tensor([[0, 2], [2, 0], [2, 4], [0, 2]])
    table = route(idx, 5, block_m=2)
    expert, first, end = table.blocks.tolist()
    live = [(e, f, n) for e, f, n in zip(expert, first, end, strict=True) if e >= 0]
    rows = sorted(r for _, f, n in live for r in range(f, min(f + 2, n)))
    assert rows == list(range(idx.numel()))
    assert table.blocks.shape[1] == 8 // 2 + 5  # the static bound: cdiv(S, block_m) + E
    assert expert[len(live) :] == [-1] * (table.blocks.shape[1] - len(live))
    assert table.offsets.tolist() == [0, 3, 3, 7, 7, 8]
    flat = idx.reshape(-1)
    assert flat[table.dest.long()].tolist() == sorted(flat.tolist())
    assert (table.src.long() == table.dest.long() // 2).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"act": "relu"}, "act='relu'"),
        ({"w_d": torch.randn(E, H + 1, INTER)}, "do not fit hidden"),
        ({"idx": torch.zeros(T, TOP_K)}, "must hold integers"),
        ({"b_gu": torch.randn(E, 3)}, "gate_up_bias"),
    ],
)
def test_bad_arguments_raise_every_problem(change, message):
    x, idx, w, w_gu, w_d, b_gu, b_d = _inputs("swiglu", False, False)
    args = {"idx": idx, "w_d": w_d, "b_gu": b_gu, "act": "swiglu", **change}
    with pytest.raises(ValueError, match=message):
        moe_experts(x, args["idx"], w, w_gu, args["w_d"], args["b_gu"], None, act=args["act"])


@pytest.mark.parametrize(
    ("act", "up", "message"),
    [
        ("clamped_swiglu", lambda w_g: w_g.clone(), "up_proj given with act='clamped_swiglu'"),
        ("swiglu", lambda w_g: w_g[:, :-1], r"up_proj \(5, 19, 24\)"),
        ("swiglu", lambda w_g: w_g.transpose(1, 2).contiguous().transpose(1, 2), "must match gate_up_proj"),
    ],
)
def test_bad_separate_up_weights_are_refused(act, up, message):
    x, idx, w, (w_g, _), w_d, _, _, _ = _split_inputs("swiglu", False, False, False)
    with pytest.raises(ValueError, match=message):
        moe_experts(x, idx, w, w_g, w_d, act=act, up_proj=up(w_g.detach()))


@gpu  # bf16 Triton GEMMs run on the GPU (the interpreter has no bf16 dot)
@pytest.mark.parametrize(
    ("act", "transposed", "bias", "split"),
    [
        ("swiglu", False, False, False),
        ("clamped_swiglu", True, True, False),
        ("limited_swiglu", False, False, False),
        ("swiglu", False, False, True),  # DBRX: separate up weights, the down weight a transposed view
        ("limited_swiglu", True, True, True),
    ],
)
@pytest.mark.parametrize(
    "inter", [INTER, 333]
)  # 333: several column blocks for every tile the autotuner tries
def test_gpu_bf16_is_as_close_to_fp32_as_the_pytorch_path(
    act, transposed, bias, split, inter, monkeypatch, tmp_path
):
    """bf16 on CUDA, the first call of a shape (the tile search's trials included: an empty cache): the Triton
    kernels' output and gradients against fp32, within 2x (+ bf16 eps) of the error the PyTorch path
    (transformers' op order) makes in bf16."""
    _bf16_against_fp32(act, transposed, bias, split, inter, monkeypatch, tmp_path)


@gpu
@pytest.mark.parametrize(("act", "transposed", "bias", "split"), [("swiglu", False, False, True),
                                                                  ("clamped_swiglu", True, True, False)])  # fmt: skip
def test_gpu_bf16_persistent_schedule_is_as_close_to_fp32(
    act, transposed, bias, split, monkeypatch, tmp_path
):
    """The rows kernel's persistent schedule (``tuning.PERSISTENT``, off by default) on CUDA, as above."""
    monkeypatch.setattr(moe_tuning, "PERSISTENT", True)
    _bf16_against_fp32(act, transposed, bias, split, 333, monkeypatch, tmp_path)


def _bf16_against_fp32(act, transposed, bias, split, inter, monkeypatch, tmp_path):
    monkeypatch.setenv(moe_tuning.tune_cache.CACHE_DIR_ENV, str(tmp_path))
    moe_tuning.reset()
    fp32 = [t.detach().cuda() if t is not None else None for t in _inputs(act, transposed, bias, inter=inter)]
    kw = dict(act=act, limit=LIMIT, alpha=ALPHA, transposed=transposed)

    def leaf(t, dtype):
        return t if t is None or not t.is_floating_point() else t.to(dtype).contiguous().requires_grad_()

    def run(dtype, backend):
        monkeypatch.setenv(K.ENV_VAR, backend)
        x, idx, w, w_gu, w_d, b_gu, b_d = [leaf(t, dtype) for t in fp32]
        w_up = None
        if split:
            w_gu, w_up = (leaf(half, dtype) for half in w_gu.detach().chunk(2, 2 if transposed else 1))
            w_d = leaf(w_d.detach().transpose(1, 2), dtype) if not transposed else w_d
        down = w_d.transpose(1, 2) if split and not transposed else w_d
        out = moe_experts(x, idx, w, w_gu, down, b_gu, b_d, up_proj=w_up, **kw)
        params = [p for p in (x, w, w_gu, w_up, w_d, b_gu, b_d) if p is not None]
        dy = torch.ones_like(out)
        return [out, *torch.autograd.grad(out, params, dy)]

    want = run(torch.float32, "torch")
    ours, theirs = run(torch.bfloat16, "triton"), run(torch.bfloat16, "torch")
    for a, b, ref in zip(ours, theirs, want, strict=True):
        scale = ref.abs().max()
        err_ours = ((a.float() - ref).abs().max() / scale).item()
        err_torch = ((b.float() - ref).abs().max() / scale).item()
        assert err_ours <= 2 * err_torch + 8e-3, (err_ours, err_torch)
