"""The llama-shaped decoder layer read from a class's source: what passes, what is refused and why, and how the
fused forward hands the layer's arguments to the attention."""

from __future__ import annotations

import pytest
from torch import nn
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.llama import modeling_llama
from transformers.models.olmo2 import modeling_olmo2
from transformers.utils.deprecation import deprecate_kwarg

from liger_registry.modules.layer_shape import LayerShape, layer_shape, part_class, planned_shape


class Shaped(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm_in = nn.Identity()
        self.norm_post = nn.LayerNorm(4)

    @deprecate_kwarg("past_key_values", "99.0.0", new_name="cache")
    def forward(self, hidden_states, mask=None, cache=None, flag: bool = True, *, extra=3, **kwargs):
        """A docstring is not a statement of the shape."""
        residual = hidden_states
        hidden_states = self.norm_in(hidden_states)
        hidden_states, _ = self.attn(hidden_states=hidden_states, mask=mask, cache=cache, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.norm_post(hidden_states)
        hidden_states = self.ffn(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class EarlierRelease(nn.Module):
    """The layer as transformers 4.56-5.x wrote it: past_key_values, cache_position, the older rename."""

    @deprecate_kwarg("past_key_value", new_name="past_key_values", version="4.58")
    def forward(
        self,
        hidden_states,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        use_cache: bool | None = False,
        cache_position=None,
        position_embeddings=None,  # necessary, but kept here for BC
        **kwargs,
    ):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        # Self Attention
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            cache_position=cache_position,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = residual + hidden_states

        # Fully Connected
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class Inherits(Shaped):
    pass


class ScaledResidual(nn.Module):
    def forward(self, hidden_states, **kwargs):
        residual = hidden_states
        hidden_states = self.norm_in(hidden_states)
        hidden_states, _ = self.attn(hidden_states=hidden_states, **kwargs)
        hidden_states = residual + hidden_states * 0.5
        residual = hidden_states
        hidden_states = self.norm_post(hidden_states)
        hidden_states = self.ffn(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class RenamedArgument(nn.Module):
    def forward(self, hidden_states, mask=None, **kwargs):
        residual = hidden_states
        hidden_states = self.norm_in(hidden_states)
        hidden_states, _ = self.attn(hidden_states=hidden_states, attention_mask=mask, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.norm_post(hidden_states)
        hidden_states = self.ffn(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class NoKwargsToAttention(nn.Module):
    def forward(self, hidden_states, mask=None, **kwargs):
        residual = hidden_states
        hidden_states = self.norm_in(hidden_states)
        hidden_states, _ = self.attn(hidden_states=hidden_states, mask=mask)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.norm_post(hidden_states)
        hidden_states = self.ffn(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


def _cached(fn):
    return fn


class OtherDecorator(nn.Module):
    @_cached
    def forward(self, hidden_states, **kwargs):
        return hidden_states


def test_the_llama_layer_is_llama_shaped_with_its_own_names():
    shape = layer_shape(modeling_llama.LlamaDecoderLayer)
    assert isinstance(shape, LayerShape)
    parts = (shape.input_norm, shape.attention, shape.post_norm, shape.mlp)
    assert parts == ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    assert "position_embeddings" in shape.passed and "attention_mask" in shape.passed
    assert part_class(modeling_llama.LlamaDecoderLayer, shape.post_norm) is modeling_llama.LlamaRMSNorm


def test_a_layer_of_any_names_is_read_and_its_arguments_bound_as_its_forward_binds_them():
    shape = layer_shape(Inherits)  # the forward is found on the base class
    assert (shape.input_norm, shape.attention, shape.post_norm, shape.mlp) == (
        "norm_in",
        "attn",
        "norm_post",
        "ffn",
    )
    assert shape.passed == ("mask", "cache")
    assert part_class(Inherits, "norm_post") is nn.LayerNorm
    # positional after hidden_states, defaults, the decorator's rename, and an unknown keyword kept for **kwargs
    assert shape.attention_kwargs(
        ("m",), {"past_key_values": "c", "other": 1, "extra": 5, "flag": False}
    ) == {
        "mask": "m",
        "cache": "c",
        "other": 1,
    }
    assert shape.attention_kwargs((), {}) == {"mask": None, "cache": None}
    with pytest.raises(TypeError, match="multiple values for mask"):
        shape.attention_kwargs(("m",), {"mask": "again"})
    with pytest.raises(TypeError, match="positional arguments"):
        shape.attention_kwargs((1, 2, 3, 4), {})


def test_an_earlier_releases_layer_is_read_with_its_rename():
    shape = layer_shape(EarlierRelease)
    assert isinstance(shape, LayerShape)
    assert shape.renamed == (("past_key_value", "past_key_values"),)
    assert shape.passed == (
        "attention_mask",
        "position_ids",
        "past_key_values",
        "use_cache",
        "cache_position",
        "position_embeddings",
    )
    got = shape.attention_kwargs((), {"past_key_value": "kv", "position_embeddings": "pe"})
    assert got["past_key_values"] == "kv" and got["use_cache"] is False and "past_key_value" not in got


@pytest.mark.parametrize(
    ("cls", "reason"),
    [
        (modeling_gemma2.Gemma2DecoderLayer, "not the llama-shaped"),  # four norms
        (modeling_olmo2.Olmo2DecoderLayer, "not the llama-shaped"),  # post-norms
        (ScaledResidual, "not the llama-shaped"),
        (RenamedArgument, "its attention gets attention_mask=mask"),
        (NoKwargsToAttention, "does not get the forward's **kwargs"),
        (OtherDecorator, "has the decorator _cached"),
    ],
)
def test_other_layers_are_refused_with_the_reason(cls, reason):
    shape = layer_shape(cls)
    assert isinstance(shape, str)
    assert shape.startswith(cls.__name__) and reason in shape


def test_a_wrappers_dynamic_subclass_runs_the_shape_planned_for_its_layer_class():
    from torch.distributed.fsdp import FSDPModule

    wrapped = type("FSDPLlamaDecoderLayer", (FSDPModule, modeling_llama.LlamaDecoderLayer), {})
    planned = layer_shape(
        modeling_llama.LlamaDecoderLayer
    )  # what the plan found before FSDP wrapped the layer
    # the wrapper's own source cannot be read under transformers 5.25 (5.17 reads it): the layer's plan is used
    assert planned_shape(wrapped) is planned
    with pytest.raises(TypeError, match="not the llama-shaped"):
        planned_shape(ScaledResidual)
