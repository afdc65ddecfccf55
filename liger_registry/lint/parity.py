"""`lint --deep`'s parity proof: logits, parameter gradients and loss of a patched tiny model vs the unpatched one.

A loss alone hides a wrong kernel: RoPE of the wrong layout moves the logits of a tiny Llama-shaped model by
1e-3 but its loss by 5e-7. So the patched model must reproduce, in fp32 on CPU, the unpatched model's logits
(eval mode, skip_logits=False), its gradient w.r.t. every parameter and its loss (training mode, through the
patched training path: FLCE without logits where the family fuses), as the convergence parity suite checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOLERANCE = (
    1e-5  # max |patched - unpatched| / (1 + max |unpatched|), per tensor (fp32, same as the parity suite)
)


@dataclass
class Run:
    """One model's outputs on the batch: eval outputs, training loss and the gradient of every parameter."""

    outputs: torch.Tensor
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float(), want.detach().float()
    if got.shape != want.shape:
        return float("inf")
    return float((got - want).abs().max() / (1 + want.abs().max()))


def _loss(out, has_head: bool) -> torch.Tensor:
    if has_head:
        return out.loss
    # A decoder without a head has no loss: a fixed random read-out of its hidden states stands in.
    hidden = out.last_hidden_state.float()
    return (hidden * torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0))).mean()


def run(model, batch: dict, has_head: bool, **eval_kwargs) -> Run:
    """Eval-mode outputs (logits, or hidden states without a head), then one training forward and backward."""
    inputs = batch if has_head else {k: v for k, v in batch.items() if k != "labels"}
    model.eval()
    with torch.no_grad():
        out = model(**inputs, **eval_kwargs)
        outputs = (out.logits if has_head else out.last_hidden_state).detach().clone()
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks, if a tiny config has dropout
    loss = _loss(model(**inputs), has_head)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return Run(outputs, loss.detach(), grads)


def differences(got: Run, want: Run, has_head: bool) -> list[str]:
    """What the patched run `got` does not reproduce of the unpatched run `want` (NaN counts as a difference)."""
    outputs = "logits" if has_head else "hidden states"
    problems = []
    if not (d := relative(got.outputs, want.outputs)) <= TOLERANCE:
        problems.append(f"{outputs} differ from the unpatched model's by {d:.2g} (> {TOLERANCE:g}, fp32 CPU)")
    if missing := [n for n in want.grads if n not in got.grads]:
        problems.append(
            f"no gradient reached {len(missing)} parameter(s) of the patched model, e.g. {missing[0]}"
        )
    common = [n for n in want.grads if n in got.grads]
    worst, name = max(((relative(got.grads[n], want.grads[n]), n) for n in common), default=(0.0, ""))
    if not worst <= TOLERANCE:
        problems.append(
            f"gradients differ from the unpatched model's by {worst:.2g} (> {TOLERANCE:g}), worst {name}"
        )
    if not (d := relative(got.loss, want.loss)) <= TOLERANCE:
        problems.append(f"loss differs from the unpatched model's by {d:.2g} (> {TOLERANCE:g})")
    return problems
