"""Numerical decisions: which formula a module computes, checked against our kernels' torch implementations."""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from liger_registry.kernels.torch_impl import geglu_torch, rms_norm_torch, swiglu_torch
from liger_registry.modules.rope import apply_rotary_pos_emb as rope_dropin
from liger_registry.scaffold.inspect import Captured
from liger_registry.schemas import KINDS

EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
GLU_PROJECTIONS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"), ("gate", "up", "down"))
FUSED_GLU = ("gate_up_proj", "gate_up")
ACT_CONFIG_ATTRS = ("hidden_act", "hidden_activation")
FP32_TOL = 1e-5


@dataclass
class Verdict:
    """What one candidate class (or function) computes: a kernel spec when it matches, else why not."""

    kernel: str
    target: str
    spec: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # set when the kernel cannot serve this target

    @property
    def ok(self) -> bool:
        return self.reason is None


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / (1 + want.abs().max()))


def _input(captured: Captured, index: int, width: int) -> torch.Tensor:
    for args in captured.inputs[index:] + captured.inputs:
        if args and torch.is_tensor(args[0]) and args[0].shape[-1] == width and args[0].is_floating_point():
            return args[0].float()
    return torch.randn(2, 5, width, generator=torch.Generator().manual_seed(index))


def _eps_attr(module: nn.Module) -> str | None:
    return next((a for a in EPS_ATTRS if isinstance(getattr(module, a, None), float)), None)


def _with_random_weight(module: nn.Module, seed: int) -> nn.Module:
    module = copy.deepcopy(module).float()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    return module


def _norm_weight(module: nn.Module) -> torch.Tensor | None:
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, nn.Parameter) and weight.dim() == 1 else None


def _forward_inputs(cls: type) -> list[str]:
    """The forward's parameters after self, other than *args/**kwargs."""
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def decide_rms_norm(captured: Captured) -> Verdict:
    """offset (0 or 1: Gemma stores weight - 1) from fp32, casting mode from bf16 against rms_norm_torch."""
    name, first = captured.cls.__name__, captured.instances[0]
    verdict = Verdict("rms_norm", captured.target or name)
    eps_attr = _eps_attr(first)
    if _norm_weight(first) is None or any(_norm_weight(m) is None for m in captured.instances):
        verdict.reason = f"{name} has no 1-D weight parameter on every instance (a scale-free norm)"
        return verdict
    if len(_forward_inputs(captured.cls)) > 1:
        verdict.reason = f"{name}'s forward takes {', '.join(_forward_inputs(captured.cls))} (a gated norm); the kernel takes x"
        return verdict
    if eps_attr is None or any(_eps_attr(m) != eps_attr for m in captured.instances):
        verdict.reason = f"{name} keeps epsilon in none of {', '.join(EPS_ATTRS)} as a float"
        return verdict
    offsets, modes = set(), {}
    for index, instance in enumerate(captured.instances[:3]):
        module = _with_random_weight(instance, index)
        x = _input(captured, index, module.weight.shape[0])
        try:
            with torch.no_grad():
                want = module(x)
        except TypeError as exc:
            verdict.reason = f"{name}'s forward needs more than the hidden states (a gated norm?): {exc}"
            return verdict
        eps = getattr(module, eps_attr)
        errs = {o: rel_err(rms_norm_torch(x, module.weight, eps, o, "gemma"), want) for o in (0.0, 1.0)}
        offset = min(errs, key=errs.get)
        if errs[offset] > FP32_TOL:
            like = (
                "a LayerNorm (it subtracts the mean)"
                if _is_layer_norm(module, x, want, eps)
                else "not RMSNorm"
            )
            verdict.reason = (
                f"{name} does not compute x / rms(x) * (offset + weight) for offset 0 or 1 in fp32 "
                f"(best max rel diff {errs[offset]:.2g}): {like}"
            )
            return verdict
        offsets.add(offset)
        mode, err = _casting_mode(module, x, eps, offset)
        modes[mode] = max(err, modes.get(mode, 0.0))
    if len(offsets) > 1 or len(modes) > 1:
        verdict.reason = (
            f"{name}'s instances disagree on the formula (offsets {offsets}, casting {sorted(modes)})"
        )
        return verdict
    verdict.spec = {"casting_mode": next(iter(modes)), "offset": offsets.pop(), "eps_attr": eps_attr}
    return verdict


def _casting_mode(module: nn.Module, x: torch.Tensor, eps: float, offset: float) -> tuple[str, float]:
    """The casting mode whose bf16 result is closest to the module's own bf16 output (ties: llama first)."""
    low, xb = copy.deepcopy(module).to(torch.bfloat16), x.to(torch.bfloat16)
    with torch.no_grad():
        want = low(xb)
    errs = {
        m: rel_err(rms_norm_torch(xb, low.weight, eps, offset, m), want) for m in ("llama", "gemma", "none")
    }
    mode = min(errs, key=errs.get)
    return mode, errs[mode]


def _is_layer_norm(module: nn.Module, x: torch.Tensor, want: torch.Tensor, eps: float) -> bool:
    bias = getattr(module, "bias", None)
    return rel_err(F.layer_norm(x, (x.shape[-1],), module.weight, bias, eps), want) <= FP32_TOL


def decide_layer_norm(captured: Captured) -> Verdict:
    """A LayerNorm class with weight, bias and epsilon that computes F.layer_norm."""
    name, first = captured.cls.__name__, captured.instances[0]
    verdict = Verdict("layer_norm", captured.target or name)
    weight, bias = _norm_weight(first), getattr(first, "bias", None)
    eps_attr = _eps_attr(first)
    if weight is None or not isinstance(bias, nn.Parameter) or eps_attr is None:
        missing = [n for n, v in (("weight", weight), ("bias", bias), ("epsilon", eps_attr)) if v is None]
        verdict.reason = (
            f"{name} has no {', '.join(missing) or 'bias parameter'} (the kernel needs weight, bias, eps)"
        )
        return verdict
    for index, instance in enumerate(captured.instances[:3]):
        module = _with_random_weight(instance, index)
        x = _input(captured, index, module.weight.shape[0])
        with torch.no_grad():
            want = module(x)
        eps = getattr(module, eps_attr)
        err = rel_err(F.layer_norm(x, (x.shape[-1],), module.weight, module.bias, eps), want)
        if err > FP32_TOL:
            verdict.reason = (
                f"{name} does not compute F.layer_norm(x, weight, bias, eps) (max rel diff {err:.2g})"
            )
            return verdict
    verdict.spec = {"eps_attr": eps_attr}
    return verdict


def glu_projections(module: nn.Module) -> tuple[str, str, str] | None:
    for names in GLU_PROJECTIONS:
        if all(isinstance(getattr(module, n, None), nn.Linear) for n in names):
            return names
    return None


def is_gated_mlp_candidate(cls: type, module: nn.Module) -> bool:
    """An MLP-like module with separate gate/up/down linears or a fused gate_up projection."""
    fused = any(isinstance(getattr(module, n, None), nn.Linear) for n in FUSED_GLU)
    return glu_projections(module) is not None or (fused and "MLP" in cls.__name__)


def decide_glu(captured: Captured, config: Any) -> Verdict:
    """swiglu or geglu: down(act(gate(x)) * up(x)) against the module's own output in fp32."""
    name, first = captured.cls.__name__, captured.instances[0]
    verdict = Verdict("swiglu", captured.target or name)
    names = glu_projections(first)
    if names is None:
        verdict.reason = (
            f"{name} has one fused gate_up projection split in its forward, not separate gate and up"
        )
        return verdict
    gate, up, down = names
    fns = {"swiglu": swiglu_torch, "geglu": geglu_torch}
    found: set[str] = set()
    for index, instance in enumerate(captured.instances[:3]):
        module = _with_random_weight(instance, index).eval()
        x = _input(captured, index, getattr(module, gate).in_features)
        with torch.no_grad():
            want = module(x)
            errs = {
                k: rel_err(getattr(module, down)(f(getattr(module, gate)(x), getattr(module, up)(x))), want)
                for k, f in fns.items()
            }
        kernel = min(errs, key=errs.get)
        if errs[kernel] > FP32_TOL:
            verdict.reason = (
                f"{name} does not compute {down}(act({gate}(x)) * {up}(x)) with silu or gelu_tanh "
                f"(best max rel diff {errs[kernel]:.2g}: another activation, or multipliers)"
            )
            return verdict
        found.add(kernel)
    if len(found) > 1:
        verdict.reason = f"{name}'s instances use different activations"
        return verdict
    verdict.kernel = found.pop()
    act_attr = next((a for a in ACT_CONFIG_ATTRS if getattr(config, a, None)), None)
    # No activation in the config: the class hard-codes it, and the numbers above said which.
    if act_attr is not None and getattr(config, act_attr) not in KINDS[verdict.kernel].activations:
        act = getattr(config, act_attr, None) if act_attr else None
        verdict.reason = (
            f"{name} computes {verdict.kernel} but the config's activation ({act_attr}={act!r}) is not one the "
            f"applier accepts for it ({', '.join(KINDS[verdict.kernel].activations)})"
        )
        return verdict
    spec = dict(zip(("gate", "up", "down"), names, strict=True))
    verdict.spec = {k: v for k, v in spec.items() if v != f"{k}_proj"}
    if act_attr not in (None, "hidden_act"):
        verdict.spec["act_config_attr"] = act_attr
    return verdict


def _interleaved(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> torch.Tensor:
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotated = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1).flatten(-2)
    return q * cos + rotated * sin


def _narrow_cos_reason(function: str, q: torch.Tensor, cos: torch.Tensor, q_out: torch.Tensor) -> str:
    width = cos.shape[-1]
    if torch.equal(q_out[..., width:], q[..., width:]):
        return (
            f"partial rotary: {function} rotates {width} of the {q.shape[-1]} channels of a head and passes the "
            "rest through; the kernel rotates the whole head"
        )
    return (
        f"{function} takes cos/sin of width {width} for heads of {q.shape[-1]} (half-width, not HF's "
        "rotate_half layout with full-width cos/sin)"
    )


def decide_rope(function: str, original: Any, calls: list[tuple[tuple, dict]]) -> Verdict:
    """The function's recorded calls replayed through our drop-in: same q and k out, or why not."""
    verdict = Verdict(
        "rope", function, spec={} if function == "apply_rotary_pos_emb" else {"function": function}
    )
    if not calls:
        verdict.reason = (
            f"{function} is not called in a forward pass: the attention rotates q and k by other code"
        )
        return verdict
    for args, kwargs in calls:
        q, cos = args[0], args[2] if len(args) > 2 else kwargs.get("cos")
        want = original(*args, **kwargs)
        if torch.is_tensor(cos) and cos.shape[-1] != q.shape[-1]:
            verdict.reason = _narrow_cos_reason(function, q, cos, want[0])
            return verdict
        try:
            got = rope_dropin(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            verdict.reason = (
                f"{function}'s calls do not fit the kernel's (q, k, cos, sin, unsqueeze_dim) contract: {exc}"
            )
            return verdict
        err = max(rel_err(g, w) for g, w in zip(got, want, strict=False))
        if err > FP32_TOL:
            unsqueeze = kwargs.get("unsqueeze_dim", args[5] if len(args) > 5 else 1)
            inter = (
                torch.is_tensor(cos)
                and rel_err(_interleaved(q, cos, args[3], unsqueeze), want[0]) <= FP32_TOL
            )
            layout = "interleaved (even/odd) pairs" if inter else "a layout other than rotate_half"
            verdict.reason = (
                f"{function} rotates {layout} (max rel diff {err:.2g}); the kernel rotates rotate_half halves"
            )
            return verdict
    return verdict


HEAD_ROLES = ("softcap_attr", "logit_scale_attr", "logit_multiplier_attr")


def _transformed(raw: torch.Tensor, config: Any, roles: dict[str, str]) -> torch.Tensor:
    from liger_registry.forwards.head import logit_transform, postprocess_logits

    return postprocess_logits(raw, *logit_transform(config, *(roles.get(r) for r in HEAD_ROLES)))


def decide_logit_roles(
    raw: torch.Tensor, logits: torch.Tensor, config: Any, candidates: list[str]
) -> dict | None:
    """Which config attributes the head divides by, multiplies by or softcaps with, so that the transformed
    raw lm_head output equals the model's logits; None when no combination of at most two does."""
    options: list[dict[str, str]] = [{}]
    options += [{role: name} for name in candidates for role in HEAD_ROLES]
    options += [
        {scale: a, "softcap_attr": b}
        for a in candidates
        for b in candidates
        if a != b
        for scale in ("logit_scale_attr", "logit_multiplier_attr")
    ]
    for roles in options:
        if rel_err(_transformed(raw, config, roles), logits) <= FP32_TOL:
            return roles
    return None
