"""scale_unless_one_: the device-side 'times grad_output unless it is 1' of the fused losses' backward."""

import pytest
import torch

from liger_registry.kernels.loss_grads import _scale_unless_one_kernel, scale_unless_one_


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("g", [1.0, 0.5, -3.0, 0.0])
def test_kernel_scales_unless_one(dtype, g):
    """Through the interpreter: several programs striding over a length that is not a multiple of the block."""
    x = torch.randn(5003).to(dtype)
    before = x.clone()
    _scale_unless_one_kernel[(3,)](x, torch.tensor([g]), x.numel(), BLOCK=512)
    if g == 1.0:
        assert torch.equal(x, before)  # untouched, bit for bit
    else:  # one rounding of the fp32 product (the interpreter's bf16 cast may round differently by an ulp)
        torch.testing.assert_close(x, (before.float() * g).to(dtype))


@pytest.mark.parametrize("g", [1.0, 2.0])
def test_cpu_path(g):
    x = torch.randn(7, 3)
    before = x.clone()
    scale_unless_one_(x, torch.tensor(g))
    assert torch.equal(x, before * g)


def test_flce_loss_times_a_factor_scales_every_gradient():
    from liger_registry import kernels as K

    torch.manual_seed(0)
    h = torch.randn(12, 8, requires_grad=True)
    w = torch.randn(30, 8, requires_grad=True)
    t = torch.randint(0, 30, (12,))
    K.fused_linear_cross_entropy(h, w, t).backward()
    g1 = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    (K.fused_linear_cross_entropy(h, w, t) * 2.5).backward()
    torch.testing.assert_close(h.grad, g1[0] * 2.5)
    torch.testing.assert_close(w.grad, g1[1] * 2.5)
