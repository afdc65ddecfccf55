"""torch.compile friendliness: no graph break on any op (backend=torch on CPU), custom ops trace with fakes."""

import warnings

import pytest
import torch

from liger_registry import kernels as K


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g, requires_grad=True)
    w = torch.randn(16, generator=g, requires_grad=True)
    q = torch.randn(1, 2, 6, 8, generator=g, requires_grad=True)
    cos, sin = torch.randn(1, 6, 8, generator=g), torch.randn(1, 6, 8, generator=g)
    head = torch.randn(20, 16, generator=g, requires_grad=True)
    target = torch.randint(0, 20, (6,), generator=g)
    return x, w, q, cos, sin, head, target


def _all_ops(x, w, q, cos, sin, head, target):
    h = K.rms_norm(x, w, 1e-6) + K.layer_norm(x, w, None, 1e-5)
    h = K.swiglu(h, x) + K.geglu(h, x)
    qo, ko = K.rope(q, q, cos, sin)
    loss = K.fused_linear_cross_entropy(h, head, target)
    loss = loss + K.cross_entropy(h @ head.t(), target)
    loss = loss + K.fused_linear_jsd(h, head, x, head, target)
    return loss + qo.sum() + ko.sum()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_no_graph_break(backend, monkeypatch):
    from liger_registry.kernels.triton_utils import INTERPRET_AT_IMPORT

    if backend == "triton" and not INTERPRET_AT_IMPORT:
        pytest.skip("Triton on CPU tensors needs the interpreter")
    monkeypatch.setenv(K.ENV_VAR, backend)
    torch._dynamo.reset()
    ex = torch._dynamo.explain(_all_ops)(*_inputs())
    assert ex.graph_break_count == 0, ex.break_reasons


def test_custom_ops_direct_with_torch_backend(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "torch")
    x, w, q, cos, sin, *_ = _inputs()

    def f(x, w, q):
        y, _ = torch.ops.liger_registry.rms_norm_fwd(x, w, 1e-6, 0.0, "llama", "torch")
        qo, _ = torch.ops.liger_registry.rope(q, q, cos, sin, False, "torch")
        return torch.ops.liger_registry.glu_fwd(y, x, 0, 1.0, 1.0, "torch").sum() + qo.sum()

    torch._dynamo.reset()
    ex = torch._dynamo.explain(f)(x, w, q)
    assert ex.graph_break_count == 0, ex.break_reasons
    ref = K.swiglu(K.rms_norm(x, w, 1e-6), x).sum() + K.rope(q, q, cos, sin)[0].sum()
    got = f(x, w, q)
    torch.testing.assert_close(got, ref)
    g1 = torch.autograd.grad(got, [x, w, q])
    g2 = torch.autograd.grad(ref, [x, w, q])
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b)


def test_opcheck_custom_ops(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "torch")
    x, w, q, cos, sin, *_ = _inputs()
    torch.library.opcheck(torch.ops.liger_registry.rms_norm_fwd.default, (x, w, 1e-6, 0.0, "gemma", "torch"))
    torch.library.opcheck(
        torch.ops.liger_registry.glu_fwd.default, (x, x.detach().clone(), 1, 1.0, 1.0, "torch")
    )
    torch.library.opcheck(
        torch.ops.liger_registry.rope.default, (q, q.detach().clone(), cos, sin, False, "torch")
    )
    torch.library.opcheck(torch.ops.liger_registry.layer_norm_fwd.default, (x, w, None, 1e-5, "torch"))


@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
def test_compiled_flce_runs_and_matches(monkeypatch, strategy):
    from liger_registry.kernels.flce import plan as flce_plan

    monkeypatch.setenv(K.ENV_VAR, "torch")
    monkeypatch.setattr(flce_plan, "VOCAB_ALIGN", 4)
    x, _, _, _, _, head, target = _inputs()
    plan = K.flce_plan(x.shape[0], x.shape[1], head.shape[0], strategy=strategy, dtype=x.dtype)
    assert plan.strategy == strategy and plan.num_chunks > 1

    def f(x, head):
        return K.fused_linear_cross_entropy(x, head, target, label_smoothing=0.1, strategy=strategy)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = compiled(x, head)
    ref = f(x, head)
    torch.testing.assert_close(out, ref)
    g1 = torch.autograd.grad(out, [x, head])
    g2 = torch.autograd.grad(ref, [x, head])
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("strategy,chunk", [("tokens", 4), ("vocab", 8)])
def test_opcheck_flce_forward(monkeypatch, strategy, chunk):
    from liger_registry.kernels.flce.options import FlceOptions, FlceRun

    x, _, _, _, _, head, target = _inputs()
    flat = FlceRun(FlceOptions(label_smoothing=0.1), strategy, chunk, "torch", 2).flat()
    args = (x.detach(), head.detach(), target, None, None, None, True, True, False, *flat)
    torch.library.opcheck(torch.ops.liger_registry.flce_forward.default, args)


@pytest.mark.parametrize("gpu", ["H200", "A100"])
@pytest.mark.parametrize("shape", [(4096, 4096, 128256), (8192, 2880, 201088), (64, 32, 256)])
def test_flce_plan_traces_without_break(gpu, shape, monkeypatch):
    """The planner runs inside the compiled forward; on a GPU its cost model takes paths a CPU run never does
    (`keeps_every_chunk`), so trace it with each GPU row's peaks at real head shapes, fullgraph."""
    from liger_registry.kernels.flce import plan as flce_plan
    from liger_registry.kernels.flce.options import options_from

    peaks = flce_plan.known_peaks(gpu)
    monkeypatch.setattr(flce_plan, "peaks_of", lambda device: peaks)
    options = options_from(None, {})

    def chunk_of(x):
        plan = flce_plan.plan_for(*shape, options, torch.bfloat16, x.device)
        return x * plan.chunk

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(chunk_of, fullgraph=True, backend="eager")(torch.ones(2))
    want = flce_plan.plan_for(*shape, options, torch.bfloat16, torch.device("cpu")).chunk
    assert got.tolist() == [want, want]
    # dynamo warns at every compile of a patched model when it traces through a cache wrapper
    assert not [str(w.message) for w in caught if "lru_cache" in str(w.message)]


def test_kernels_avoid_calls_dynamo_of_torch_2_11_breaks_on():
    """`min`/`max` with `default=` graph-break under dynamo in torch 2.11 (the GPU image's torch); code that runs
    inside a compiled forward (the kernels package) must not use them, whatever torch CI has."""
    import ast
    from pathlib import Path

    root = Path(K.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("min", "max")
                and any(k.arg == "default" for k in node.keywords)
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, found


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_compiled_flce_backward_scales_out_of_place(backend, monkeypatch):
    """Under compile the backward scales the saved gradients out of place (no functionalised copy of dW before an
    in-place scale), with the in-place kernel's rounding: bf16 gradients equal eager's for a grad_output != 1."""
    monkeypatch.setenv(K.ENV_VAR, backend)
    if backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, _, _, _, _, head, target = _inputs()
    x, head = (t.detach().to(torch.float16).requires_grad_() for t in (x, head))
    graphs = []

    def capture(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(g, _):
            graphs.append(g)
            return g.forward

        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    def f(x, head):
        return K.fused_linear_cross_entropy(x, head, target) * 0.37

    torch._dynamo.reset()
    out = torch.compile(f, backend=capture, fullgraph=True)(x, head)
    got = torch.autograd.grad(out, [x, head])
    want = torch.autograd.grad(f(x, head), [x, head])
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float16
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    backward = graphs[-1].code
    assert "mul" in backward
    for copy_or_mutation in ("flce_scale_grads", "aten.copy", "clone", "as_strided"):
        assert copy_or_mutation not in backward, backward
