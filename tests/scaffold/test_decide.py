"""The numerical decisions: each formula is told apart from the others on random input."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama import modeling_llama

from liger_registry.scaffold import decide
from liger_registry.scaffold.inspect import Captured


class LlamaLikeNorm(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(
            x.dtype
        )


class GemmaLikeNorm(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = 1e-6

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class BiasFreeLayerNorm(LlamaLikeNorm):
    def forward(self, x):
        return self.weight * F.layer_norm(x, (x.shape[-1],), eps=self.variance_epsilon)


class GatedNorm(LlamaLikeNorm):
    def forward(self, x, gate=None):
        return super().forward(x if gate is None else x * F.silu(gate))


def captured(module):
    return Captured(type(module), [module])


def test_rms_norm_llama_formula():
    verdict = decide.decide_rms_norm(captured(LlamaLikeNorm()))
    assert verdict.ok, verdict.reason
    assert verdict.spec == {"casting_mode": "llama", "offset": 0.0, "eps_attr": "variance_epsilon"}


def test_rms_norm_gemma_offset_and_casting():
    verdict = decide.decide_rms_norm(captured(GemmaLikeNorm()))
    assert verdict.ok, verdict.reason
    assert verdict.spec == {"casting_mode": "gemma", "offset": 1.0, "eps_attr": "eps"}


def test_a_mean_subtracting_norm_is_not_rms_norm():
    verdict = decide.decide_rms_norm(captured(BiasFreeLayerNorm()))
    assert not verdict.ok and "LayerNorm" in verdict.reason


def test_a_gated_norm_is_refused_even_where_its_gate_defaults_to_none():
    verdict = decide.decide_rms_norm(captured(GatedNorm()))
    assert not verdict.ok and "gated" in verdict.reason


class GatedMLP(nn.Module):
    def __init__(self, act, multiplier=1.0):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
        self.down_proj = nn.Linear(32, 16, bias=False)
        self.act, self.multiplier = act, multiplier

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x) * self.multiplier) * self.up_proj(x))


class Config:
    def __init__(self, **values):
        self.__dict__.update(values)


def test_glu_activation_decided_numerically():
    swiglu = decide.decide_glu(captured(GatedMLP(F.silu)), Config(hidden_act="silu"))
    geglu = decide.decide_glu(
        captured(GatedMLP(lambda x: F.gelu(x, approximate="tanh"))),
        Config(hidden_activation="gelu_pytorch_tanh"),
    )
    assert (swiglu.kernel, swiglu.ok, swiglu.spec) == ("swiglu", True, {})
    assert (geglu.kernel, geglu.ok, geglu.spec) == ("geglu", True, {"act_config_attr": "hidden_activation"})


def test_glu_with_a_multiplier_or_exact_gelu_is_refused():
    assert not decide.decide_glu(captured(GatedMLP(F.silu, multiplier=2.0)), Config(hidden_act="silu")).ok
    assert not decide.decide_glu(captured(GatedMLP(F.gelu)), Config(hidden_act="gelu")).ok


def test_glu_whose_config_names_another_activation_is_refused():
    verdict = decide.decide_glu(captured(GatedMLP(F.silu)), Config(hidden_act="relu"))
    assert not verdict.ok and "relu" in verdict.reason


def _rope_call(width, head_dim=8):
    q, k = torch.randn(2, 4, 5, head_dim), torch.randn(2, 2, 5, head_dim)
    cos, sin = torch.randn(2, 5, width), torch.randn(2, 5, width)
    return (q, k, cos, sin), {}


def test_rope_rotate_half_matches():
    fn = modeling_llama.apply_rotary_pos_emb
    assert decide.decide_rope("apply_rotary_pos_emb", fn, [_rope_call(8)]).ok


def test_rope_partial_and_interleaved_are_named():
    def partial(q, k, cos, sin, unsqueeze_dim=1):
        d = cos.shape[-1]
        q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q[..., :d], k[..., :d], cos, sin)
        return torch.cat([q_rot, q[..., d:]], -1), torch.cat([k_rot, k[..., d:]], -1)

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

        def rot(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)

        return q * c + rot(q) * s, k * c + rot(k) * s

    assert "partial rotary" in decide.decide_rope("apply_rotary_pos_emb", partial, [_rope_call(4)]).reason
    assert "interleaved" in decide.decide_rope("apply_rotary_pos_emb", interleaved, [_rope_call(8)]).reason
    assert "not called" in decide.decide_rope("apply_rotary_pos_emb", partial, []).reason


def test_logit_roles_tell_divide_multiply_and_softcap_apart():
    raw = torch.randn(2, 3, 10)
    config = Config(logits_scaling=1.3, logit_scale=0.7, final_logit_softcapping=5.0)
    names = ["final_logit_softcapping", "logit_scale", "logits_scaling"]
    assert decide.decide_logit_roles(raw, raw / 1.3, config, names) == {"logit_scale_attr": "logits_scaling"}
    assert decide.decide_logit_roles(raw, raw * 0.7, config, names) == {
        "logit_multiplier_attr": "logit_scale"
    }
    capped = torch.tanh(raw * 0.7 / 5.0) * 5.0
    assert decide.decide_logit_roles(raw, capped, config, names) == {
        "logit_multiplier_attr": "logit_scale",
        "softcap_attr": "final_logit_softcapping",
    }
    assert decide.decide_logit_roles(raw, raw + 1.0, config, names) is None


def test_another_layer_kind_only_for_another_kind_of_block():
    from liger_registry.scaffold.draft import _other_layer_kind

    lfm2_config = (
        'self.layer_types = [\n    "full_attention" if i in self.full_attn_idxs else "conv" for i in r\n]'
    )
    assert _other_layer_kind({"full_attention"}, lfm2_config) == "conv"
    assert _other_layer_kind({"full_attention"}, 'if config.layer_types[i] != "conv":') == "conv"
    assert _other_layer_kind({"full_attention"}, 'if config.layer_types[i] == "sliding_attention":') is None
    assert _other_layer_kind({"full_attention"}, 'config.mlp_layer_types[i] == "sparse"') is None
    assert _other_layer_kind({"linear_attention"}, "") == "full_attention"
