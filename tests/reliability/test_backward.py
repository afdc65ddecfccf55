"""A second backward through an FLCE loss (retain_graph, autograd.grad twice, gradient penalties): right
gradients where it can be served, else a RuntimeError that says which option to use; never a wrong gradient."""

from __future__ import annotations

import pytest
import torch

from liger_registry import kernels as K


def _inputs():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 8, generator=g, requires_grad=True)
    weight = torch.randn(10, 8, generator=g, requires_grad=True)
    return hidden, weight, torch.randint(0, 10, (6,), generator=g)


@pytest.mark.reliability("silent_wrong")
def test_first_backward_is_right_and_a_second_one_refused(cases) -> None:
    """Whether grad_output was 1 is known only on the device (no host sync), so any second backward over the
    graph is refused: never a gradient scaled twice."""
    hidden, weight, target = _inputs()
    loss = K.fused_linear_cross_entropy(hidden, weight, target)
    ref = torch.autograd.grad(torch.nn.functional.cross_entropy(hidden @ weight.t(), target), hidden)[0]
    cases.tried(2)
    loss.backward(retain_graph=True)
    torch.testing.assert_close(hidden.grad, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="backward once per graph"):
        loss.backward(retain_graph=True)
    torch.testing.assert_close(hidden.grad, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize("how", ["backward", "autograd.grad"])
def test_second_scaled_backward_says_which_option_to_use(how, cases) -> None:
    hidden, weight, target = _inputs()
    loss = K.fused_linear_cross_entropy(hidden, weight, target) * 2.0
    cases.tried()
    if how == "backward":
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="fused_linear_cross_entropy=False.*reduction='none'"):
            loss.backward()
    else:
        torch.autograd.grad(loss, hidden, retain_graph=True)
        with pytest.raises(RuntimeError, match="fused_linear_cross_entropy=False.*reduction='none'"):
            torch.autograd.grad(loss, hidden)


@pytest.mark.reliability("silent_wrong")
def test_reduction_none_serves_repeated_scaled_backward(cases) -> None:
    hidden, weight, target = _inputs()
    loss = K.fused_linear_cross_entropy(hidden, weight, target, reduction="none").sum() * 2.0
    ref_loss = torch.nn.functional.cross_entropy(hidden @ weight.t(), target, reduction="sum") * 2.0
    ref = torch.autograd.grad(ref_loss, hidden)[0]
    for _ in range(2):
        cases.tried()
        torch.testing.assert_close(
            torch.autograd.grad(loss, hidden, retain_graph=True)[0], ref, rtol=1e-4, atol=1e-5
        )
