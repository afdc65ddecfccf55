"""Module forwards and methods for the fused gate_up MLPs, GPT-OSS's clamped experts gate and relu²."""

from __future__ import annotations

from liger_registry.kernels.glu_variants import glu_fused, relu_squared, swiglu_clamped


def gate_up_mlp_forward(kind: str, gate_up: str = "gate_up_proj", down: str = "down_proj"):
    """Forward of an MLP with one fused ``gate_up_proj`` (gate = first half): ``Phi3MLP``, ``GlmMLP``,
    ``Glm4MLP`` ``.forward``; the projections stay, the split and activation-times-up are one kernel."""

    def forward(self, hidden_states):
        return getattr(self, down)(glu_fused(getattr(self, gate_up)(hidden_states), kind))

    return forward


def gpt_oss_apply_gate(self, gate_up):
    """``GptOssExperts._apply_gate``: every experts implementation of transformers (eager loop, batched and
    grouped mm) calls it between the expert GEMMs, which stay as they are."""
    return swiglu_clamped(gate_up, self.limit, self.alpha)


def relu_squared_forward(self, input):
    """``ReLUSquaredActivation.forward`` (``ACT2FN["relu2"]``, nemotron's MLP activation)."""
    return relu_squared(input)
