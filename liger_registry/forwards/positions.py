"""Default positions: the base model's attention masks without transformers' packed-sequence check.

Called without ``position_ids``, a base model numbers every row ``0 .. T-1`` itself, so each row holds one
sequence. Its mask functions are then handed those positions and, with no attention mask and no cache, look for
packed sequences in them (``find_packed_sequence_indices``). In eager mode that reads the positions on the host:
a device sync in every forward. Under torch.compile it cannot read them, so it keeps a packed-sequence mask,
builds a [B, 1, T, T] mask and SDPA runs with it instead of ``is_causal``, in every layer, forward and backward.

The patched model's base model (in a multimodal model, the text model it passes its keywords to) gets a forward
that runs, per call, either its original forward or a copy whose mask functions are called with
``position_ids=None``: exactly the masks transformers builds for unpacked rows. The causal-LM forward picks the
copy (by the keyword :data:`DEFAULT_POSITIONS`) only when its caller passed no positions and only text; every
other call (packed positions, a multimodal input) runs the original.
"""

from __future__ import annotations

DEFAULT_POSITIONS = "liger_registry_default_positions"
# What a text-only call may pass on to the base model besides its positions (anything else, e.g. pixel_values or
# token_type_ids, may build its positions or masks another way: that call runs the original forward)
TEXT_INPUTS = frozenset(
    {
        "input_ids",
        "inputs_embeds",
        "attention_mask",
        "past_key_values",
        "use_cache",
        "cache_position",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "num_items_in_batch",
        "return_dict",
        "shift_labels",
        "ignore_index",
    }
)


def default_positions_call(named: dict, extra: dict) -> bool:
    """Whether a causal-LM call leaves the positions to the base model and passes it only text."""
    if named.get("position_ids") is not None or extra.get("position_ids") is not None:
        return False
    given = {k for k, v in {**named, **extra}.items() if v is not None}
    return given <= TEXT_INPUTS
