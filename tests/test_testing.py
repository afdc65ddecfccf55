"""liger_registry.testing: the tiny configs every parity, lint and compile check builds its model from."""

from __future__ import annotations

from liger_registry.testing import tiny_config


def test_a_nested_override_updates_the_entrys_nested_sizes():
    """glm4v_moe's entry shrinks the vision tower; an override of one vision field keeps the rest tiny (a dict
    override once replaced the entry's whole vision_config: a 0.9-billion-parameter tower)."""
    vision = tiny_config("glm4v_moe", vision_config={"hidden_act": "gelu"}).vision_config
    assert (vision.hidden_act, vision.depth, vision.hidden_size, vision.intermediate_size) == (
        "gelu",
        1,
        32,
        64,
    )


def test_an_override_wins_over_the_entry():
    config = tiny_config("glm4v_moe", text_config={"num_attention_heads": 4})
    assert config.text_config.num_attention_heads == 4
    assert config.text_config.n_routed_experts == 4  # the entry's, untouched
