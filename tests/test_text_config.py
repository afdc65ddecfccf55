"""The one text-config rule: the family's text_config_attr, else transformers' get_text_config()."""

from transformers import LlamaConfig, LlavaConfig

from liger_registry.attr_path import text_config
from liger_registry.forwards.head import logit_transform
from liger_registry.registry.loader import load_registry
from liger_registry.registry.plan import language_config


def _multimodal():
    return LlavaConfig(
        text_config=LlamaConfig(
            vocab_size=96, hidden_size=16, num_attention_heads=2, num_key_value_heads=2
        ).to_dict()
    )


def test_a_nested_text_config_is_found_without_an_attr():
    config = _multimodal()
    assert text_config(config, None) is config.text_config
    assert text_config(config, "text_config") is config.text_config
    plain = LlamaConfig()
    assert text_config(plain, None) is plain


def test_the_forward_and_the_plan_read_the_same_config():
    """The head's logit transform reads the nested config the plan sizes the head by."""
    config = _multimodal()
    config.text_config.logits_scaling = 4.0
    entry = load_registry().families["llama"].entry
    assert language_config(config, entry) is text_config(config, entry.head.text_config_attr)
    assert logit_transform(text_config(config, None), None, "logits_scaling") == (None, 0.25)
