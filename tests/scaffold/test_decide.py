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


class OptionalScaleNorm(GemmaLikeNorm):
    """Gemma4RMSNorm's shape: with_scale=False holds no weight and returns x / rms(x)."""

    def __init__(self, with_scale=True, width=16, subtracts_mean=False):
        super().__init__(width)
        self.subtracts_mean = subtracts_mean
        if not with_scale:
            del self.weight

    def forward(self, x):
        xf = x.float()
        if self.subtracts_mean:
            xf = xf - xf.mean(-1, keepdim=True)
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if hasattr(self, "weight"):
            out = out * (1.0 + self.weight.float())
        return out.type_as(x)


def test_rms_norm_with_instances_without_weight_gets_weight_optional():
    norms = [OptionalScaleNorm(), OptionalScaleNorm(with_scale=False), OptionalScaleNorm()]
    verdict = decide.decide_rms_norm(Captured(OptionalScaleNorm, norms))
    assert verdict.ok, verdict.reason
    assert verdict.spec == {
        "casting_mode": "gemma",
        "offset": 1.0,
        "eps_attr": "eps",
        "weight_optional": True,
    }


def test_rms_norm_whose_unweighted_instances_compute_something_else_is_refused():
    norms = [OptionalScaleNorm(), OptionalScaleNorm(with_scale=False, subtracts_mean=True)]
    verdict = decide.decide_rms_norm(Captured(OptionalScaleNorm, norms))
    assert not verdict.ok and "without a weight does not compute x / rms(x)" in verdict.reason


def test_rms_norm_without_any_weight_is_refused():
    verdict = decide.decide_rms_norm(captured(OptionalScaleNorm(with_scale=False)))
    assert not verdict.ok and "scale-free" in verdict.reason


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


class ClampedMLP(GatedMLP):
    """DeepseekV4MLP's shape: gate clamped above, up to +-limit; `clamps` False holds a limit it never uses."""

    def __init__(self, limit=10.0, clamps=True):
        super().__init__(F.silu)
        self.limit, self.clamps = limit, clamps

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.clamps:
            gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
        return self.down_proj(F.silu(gate) * up)


def test_glu_clamped_at_a_module_limit_gets_the_limit_option():
    """Even where the probe's values stay inside the module's limit (10 here), the clamp is found."""
    verdict = decide.decide_glu(captured(ClampedMLP()), Config(hidden_act="silu"))
    assert (verdict.kernel, verdict.ok, verdict.spec) == ("swiglu", True, {"limit": "limit"})


def test_glu_holding_an_unused_limit_gets_no_clamp():
    verdict = decide.decide_glu(captured(ClampedMLP(clamps=False)), Config(hidden_act="silu"))
    assert (verdict.kernel, verdict.ok, verdict.spec) == ("swiglu", True, {})


class SparseGateMLP(GatedMLP):
    """Gemma3nTextMLP's shape: where `activation_sparsity` > 0, its own gaussian top-k on the gate first."""

    def __init__(self, sparsity):
        super().__init__(lambda x: F.gelu(x, approximate="tanh"))
        self.activation_sparsity = sparsity

    def _gaussian_topk(self, g):
        cutoff = g.mean(-1, keepdim=True) + g.std(-1, keepdim=True, unbiased=False) * 1.6448536
        return F.relu(g - cutoff)

    def forward(self, x):
        gate = self.gate_proj(x)
        if self.activation_sparsity > 0:
            gate = self._gaussian_topk(gate)
        return self.down_proj(self.act(gate) * self.up_proj(x))


def test_glu_with_a_sparse_gate_gets_gate_sparsity_on_sparse_and_dense_instances():
    """Sparse and dense instances of one class agree on the option (at sparsity 0 it changes nothing)."""
    mlps = [SparseGateMLP(0.95), SparseGateMLP(0.0)]
    verdict = decide.decide_glu(Captured(SparseGateMLP, mlps), Config(hidden_activation="gelu_pytorch_tanh"))
    want = {"gate_sparsity": "activation_sparsity", "act_config_attr": "hidden_activation"}
    assert (verdict.kernel, verdict.ok, verdict.spec) == ("geglu", True, want)


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


def _llama_partial(q, k, cos, sin, unsqueeze_dim=1):
    d = cos.shape[-1]
    q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q[..., :d], k[..., :d], cos, sin, unsqueeze_dim)
    return torch.cat([q_rot, q[..., d:]], -1), torch.cat([k_rot, k[..., d:]], -1)


def _per_channel_interleaved(q, k, cos, sin, unsqueeze_dim=1):
    """Cohere's layout: pairs (2j, 2j + 1) with cos/sin given per channel."""
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rot(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)

    return q * c + rot(q) * s, k * c + rot(k) * s


def test_rope_variants_are_drafted_where_the_family_function_is_reproduced():
    """Partial (phi3), interleaved with the first half's cos repeated per pair (glm4) and GPT-OSS's half-split:
    each layout is told apart on the families' own functions, with full-head rotate_half kept as the default."""
    from transformers.models.glm4 import modeling_glm4
    from transformers.models.gpt_oss import modeling_gpt_oss
    from transformers.models.phi3 import modeling_phi3

    cases = [
        (modeling_llama.apply_rotary_pos_emb, 8, {}),
        (modeling_phi3.apply_rotary_pos_emb, 4, {"layout": "partial"}),
        (_llama_partial, 4, {"layout": "partial"}),
        (modeling_glm4.apply_rotary_pos_emb, 4, {"layout": "interleaved"}),
        (modeling_glm4.apply_rotary_pos_emb, 8, {"layout": "interleaved"}),
        # a half-width table: the default rope reads cos[..., :head_dim // 2] (the reference library's rule),
        # which is GPT-OSS's half-split rotation, so no layout is needed
        (modeling_gpt_oss.apply_rotary_pos_emb, 4, {}),
    ]
    for fn, width, spec in cases:
        verdict = decide.decide_rope("apply_rotary_pos_emb", fn, [_rope_call(width)])
        assert verdict.ok and verdict.spec == spec, (fn.__module__, width, verdict.reason)


def test_rope_layouts_none_reproduces_are_refused_with_the_reason():
    per_channel = decide.decide_rope("apply_rotary_pos_emb", _per_channel_interleaved, [_rope_call(8)])
    assert not per_channel.ok and "given per channel" in per_channel.reason

    def shifted(q, k, cos, sin, unsqueeze_dim=1):
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin + 0.1, unsqueeze_dim)

    other = decide.decide_rope("apply_rotary_pos_emb", shifted, [_rope_call(8)])
    assert not other.ok and "none of the rope layouts" in other.reason and "half_split" in other.reason
    assert "not called" in decide.decide_rope("apply_rotary_pos_emb", _llama_partial, []).reason


def test_rope_dtypes_are_judged_on_the_calls_of_the_model_in_bf16():
    """ernie4_5 keeps cos/sin in fp32 and casts the results back: with the bf16 model's calls (q bf16, cos fp32)
    the plain interleaved drop-in (results promoted to fp32) is refused and interleaved_fp32 drafted; helium
    (cos in q's dtype, no cast) keeps interleaved."""
    from transformers.models.ernie4_5 import modeling_ernie4_5
    from transformers.models.helium import modeling_helium

    (q, k, cos, sin), _ = _rope_call(8)
    low_fp32_cos = [((q.bfloat16(), k.bfloat16(), cos, sin), {})]
    low_bf16_cos = [((q.bfloat16(), k.bfloat16(), cos.bfloat16(), sin.bfloat16()), {})]
    ernie = modeling_ernie4_5.apply_rotary_pos_emb
    verdict = decide.decide_rope("apply_rotary_pos_emb", ernie, [_rope_call(8)], low_fp32_cos)
    assert verdict.ok and verdict.spec == {"layout": "interleaved_fp32"}, verdict.reason
    helium = modeling_helium.apply_rotary_pos_emb
    verdict = decide.decide_rope("apply_rotary_pos_emb", helium, [_rope_call(8)], low_bf16_cos)
    assert verdict.ok and verdict.spec == {"layout": "interleaved"}, verdict.reason


def test_rope_layout_whose_bf16_result_dtype_differs_is_refused():
    def always_fp32(q, k, cos, sin, unsqueeze_dim=1):
        q_out, k_out = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        return q_out.float(), k_out.float()

    verdict = decide.decide_rope("apply_rotary_pos_emb", always_fp32, [_rope_call(8)])
    assert not verdict.ok and "bf16 results" in verdict.reason


class FusedGateUpMLP(nn.Module):
    def __init__(self, up_first=False):
        super().__init__()
        self.gate_up_proj = nn.Linear(16, 64, bias=False)
        self.down_proj = nn.Linear(32, 16, bias=False)
        self.up_first = up_first

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if self.up_first:
            gate, up = up, gate
        return self.down_proj(up * F.silu(gate))


def test_fused_gate_up_is_drafted_gate_first_and_an_up_first_split_is_refused():
    verdict = decide.decide_glu(captured(FusedGateUpMLP()), Config(hidden_act="silu"))
    assert (verdict.kernel, verdict.ok, verdict.spec) == ("swiglu", True, {"gate_up": "gate_up_proj"})
    up_first = decide.decide_glu(captured(FusedGateUpMLP(up_first=True)), Config(hidden_act="silu"))
    assert not up_first.ok and "chunk(2)" in up_first.reason


class LayerNorm1P(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class LayerNormTimesTwo(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight * 2, self.bias, self.eps)


def test_layer_norm_offset_one_is_layer_norm_1p():
    plain = decide.decide_layer_norm(captured(nn.LayerNorm(16)))
    one_p = decide.decide_layer_norm(captured(LayerNorm1P(16)))
    assert plain.ok and plain.spec == {"eps_attr": "eps"}
    assert one_p.ok and one_p.spec == {"eps_attr": "eps", "offset": 1.0}
    assert not decide.decide_layer_norm(captured(LayerNormTimesTwo(16))).ok


class BiasFreeCohereLikeNorm(LlamaLikeNorm):
    """Cohere's LayerNorm: mean subtracted, scaled by the weight, no bias parameter at all."""

    def forward(self, x):
        xf = x.float()
        centred = xf - xf.mean(-1, keepdim=True)
        normed = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * normed).to(x.dtype)


def test_a_layer_norm_without_bias_is_served_and_a_wrong_formula_still_refused():
    """The kernel adds a bias only where the module holds one: a bias-free LayerNorm (Cohere's) is drafted on,
    with the module's epsilon attribute; one computing another formula is still left off."""
    verdict = decide.decide_layer_norm(captured(BiasFreeCohereLikeNorm()))
    assert verdict.ok, verdict.reason
    assert verdict.spec == {"eps_attr": "variance_epsilon"}
    assert not decide.decide_layer_norm(captured(LlamaLikeNorm())).ok  # RMSNorm: no mean subtracted


def test_relu_squared_only_for_an_activation_computing_it():
    from transformers.activations import ACT2FN

    relu2, gelu = ACT2FN["relu2"], ACT2FN["gelu_new"]
    assert decide.is_relu_squared_candidate(type(relu2))
    verdict = decide.decide_relu_squared(captured(relu2))
    assert verdict is not None and verdict.ok and verdict.kernel == "relu_squared"
    assert decide.decide_relu_squared(captured(gelu)) is None


def test_clamped_gate_checked_against_the_experts_own_apply_gate():
    from transformers.models.gpt_oss import modeling_gpt_oss

    config = modeling_gpt_oss.GptOssConfig(
        hidden_size=16, intermediate_size=16, num_local_experts=2, num_attention_heads=2
    )
    experts = modeling_gpt_oss.GptOssExperts(config)
    assert decide.is_clamped_gate_candidate(type(experts), experts)
    assert decide.decide_clamped_gate(captured(experts)).ok
    unclamped = type(
        "Unclamped", (modeling_gpt_oss.GptOssExperts,), {"_apply_gate": lambda self, g: g[..., ::2]}
    )
    other = decide.decide_clamped_gate(captured(unclamped(config)))
    assert not other.ok and "clamped SwiGLU" in other.reason


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
