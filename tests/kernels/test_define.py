"""define_op: one definition gives the custom op, a fake derived from the PyTorch branch, autograd and an eager
twin; checked on a toy op (scale rows by 2, keeping the input's layout on one branch only when asked)."""

import pytest
import torch
from torch import Tensor

from liger_registry.kernels.define import define_op


def _double_impl(x: Tensor, backend: str) -> Tensor:
    return (x * 2).contiguous()


def _double_setup(ctx, inputs, output):
    ctx.backend = inputs[1]


def _double_backward(ctx, dy):
    return DOUBLE_BWD.from_backward(ctx, dy, ctx.backend), None


DOUBLE_BWD = define_op("test_define_double_bwd", _double_impl)
DOUBLE = define_op("test_define_double", _double_impl, setup=_double_setup, backward=_double_backward)


@pytest.mark.parametrize("layout", ["rows", "transposed"])
def test_derived_fake_and_autograd_pass_opcheck(layout):
    x = torch.randn(4, 6, requires_grad=True)
    if layout == "transposed":
        x = torch.randn(6, 4).t().requires_grad_()
    torch.library.opcheck(torch.ops.liger_registry.test_define_double.default, (x, "torch"))


def test_eager_twin_and_compiled_call_agree():
    x = torch.randn(5, 3, requires_grad=True)
    (g_eager,) = torch.autograd.grad(DOUBLE(x, "torch").sum(), x)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: DOUBLE(t, "torch").sum(), fullgraph=True, backend="aot_eager")
    (g_compiled,) = torch.autograd.grad(compiled(x), x)
    torch.testing.assert_close(g_eager, torch.full_like(x, 2.0))
    torch.testing.assert_close(g_compiled, g_eager)


def test_fake_that_disagrees_with_the_kernel_is_caught():
    """A fake that drifts from the real output's layout is what crashed inductor on CUDA (docs/design/compile.md):
    opcheck must see it."""

    def impl(x: Tensor, backend: str) -> Tensor:
        return x.t().contiguous().t()  # column-major output

    bad = define_op("test_define_bad_fake", impl, fake=lambda x, backend: x.new_empty(x.shape))
    with pytest.raises(Exception, match="stride|layout|Stride"):
        torch.library.opcheck(
            torch.ops.liger_registry.test_define_bad_fake.default, (torch.randn(3, 4), "torch")
        )
    assert bad.name == "test_define_bad_fake"


def test_setup_without_backward_is_refused():
    with pytest.raises(TypeError, match="go together"):
        define_op("test_define_half", _double_impl, setup=_double_setup)


def test_fast_apply_records_the_same_graph_as_apply_and_defers_to_it_under_transforms():
    """fast_apply skips Function.apply's Python layer only outside functorch transforms: the graph node and the
    gradient are apply's; under torch.func.grad it behaves exactly as apply (which refuses a Function without
    setup_context)."""
    from liger_registry.kernels.define import fast_apply

    x = torch.randn(3, requires_grad=True)
    y = DOUBLE.eager(x, "torch")
    assert type(y.grad_fn).__name__ == "test_define_double_eagerBackward"
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, torch.full_like(x, 2.0))
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: DOUBLE.eager(t, "torch").sum())(x.detach())

    class WithSetup(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

    with pytest.raises(TypeError, match="setup_context needs Function.apply"):
        fast_apply(WithSetup)
