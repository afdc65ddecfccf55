"""The apply_rotary_pos_emb drop-in matches the HF functions it replaces, layouts and dtypes included."""

import pytest
import torch
from transformers.models.llama import modeling_llama
from transformers.models.olmo2 import modeling_olmo2

from liger_registry.modules.rope import apply_rotary_pos_emb


def _inputs(dtype, cos_dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g).to(dtype)
    k = torch.randn(2, 2, 6, 8, generator=g).to(dtype)
    cos, sin = (
        torch.randn(2, 6, 8, generator=g).to(cos_dtype),
        torch.randn(2, 6, 8, generator=g).to(cos_dtype),
    )
    return q, k, cos, sin


@pytest.mark.parametrize("hf", [modeling_llama.apply_rotary_pos_emb, modeling_olmo2.apply_rotary_pos_emb])
def test_matches_hf_with_fp32_cos_and_bf16_q(hf):
    q, k, cos, sin = _inputs(torch.bfloat16, torch.float32)
    ours, ref = apply_rotary_pos_emb(q, k, cos, sin), hf(q, k, cos, sin)
    for a, b, x in zip(ours, ref, (q, k), strict=True):
        assert a.dtype == x.dtype
        if hf is modeling_olmo2.apply_rotary_pos_emb:  # OLMo 2 rotates in fp32, then casts: bit-equal
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_seq_first_layout():
    q, k, cos, sin = _inputs(torch.float32, torch.float32)
    expected = modeling_llama.apply_rotary_pos_emb(
        q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2
    )
    ours = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    for a, b in zip(ours, expected, strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3)


@pytest.mark.parametrize("model_type", ["ernie4_5", "ernie4_5_moe"])
def test_interleaved_fp32_matches_ernie_in_value_and_dtype(model_type):
    """ernie4_5 keeps cos/sin in fp32, rotates interleaved pairs in fp32 and casts back: the drop-in does the same
    (the plain interleaved drop-in would hand the attention fp32 q/k and break its bf16 o_proj)."""
    import importlib

    from liger_registry.modules.rope import apply_rotary_pos_emb_interleaved_fp32

    hf = importlib.import_module(
        f"transformers.models.{model_type}.modeling_{model_type}"
    ).apply_rotary_pos_emb
    q, k, cos, sin = _inputs(torch.bfloat16, torch.float32)
    ours, ref = apply_rotary_pos_emb_interleaved_fp32(q, k, cos, sin), hf(q, k, cos, sin)
    for a, b, x in zip(ours, ref, (q, k), strict=True):
        assert a.dtype == b.dtype == x.dtype
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    q, k, cos, sin = _inputs(torch.float32, torch.float32)
    for a, b in zip(apply_rotary_pos_emb_interleaved_fp32(q, k, cos, sin), hf(q, k, cos, sin), strict=True):
        torch.testing.assert_close(a, b)


def test_interleaved_repeated_matches_glm4v_partial_rotary():
    """glm4v's M-RoPE hands apply_rotary_pos_emb cos/sin repeat-interleaved over half the head
    (partial_rotary_factor 0.5): the interleaved_repeated drop-in reproduces it, the glm4 interleaved one (which
    reads the first half of cos as one value per pair) does not."""
    from transformers.models.glm4v import modeling_glm4v

    from liger_registry.modules.rope import (
        apply_rotary_pos_emb_interleaved,
        apply_rotary_pos_emb_interleaved_repeated,
    )

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 6, 16, generator=g), torch.randn(2, 2, 6, 16, generator=g)
    angles = torch.randn(2, 6, 4, generator=g)
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    ref = modeling_glm4v.apply_rotary_pos_emb(q, k, cos, sin)
    for a, b in zip(apply_rotary_pos_emb_interleaved_repeated(q, k, cos, sin), ref, strict=True):
        torch.testing.assert_close(a, b)
    wrong = apply_rotary_pos_emb_interleaved(q, k, cos, sin)
    assert not torch.allclose(wrong[0], ref[0], atol=1e-3)
