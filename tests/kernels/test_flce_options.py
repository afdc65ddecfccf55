"""FlceOptions: validation when built, the two ways of giving options to fused_linear_cross_entropy."""

import dataclasses

import pytest
import torch
from kernel_refs import flce_reference

from liger_registry import kernels as K


def _inputs(n=21, h=8, v=30):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = torch.randn(v, h, generator=g).requires_grad_()
    return hidden, weight, torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"chunk_mem_const": 2, "max_chunk_mib": 64}, "one budget knob"),
        ({"chunk_mem_const": 0}, "chunk_mem_const"),
        ({"max_chunk_mib": 0}, "max_chunk_mib"),
        ({"max_chunk_mib": float("inf")}, "max_chunk_mib"),
        ({"max_chunk_mib": True}, "max_chunk_mib"),
        ({"strategy": "rows"}, "strategy='rows'.*auto, tokens, vocab"),
        ({"reduction": "avg"}, "reduction"),
        ({"label_smoothing": 1.5}, "label_smoothing"),
        ({"softcap": 0.0}, "softcap"),
        ({"logit_scale": -1.0}, "logit_scale"),
        ({"ignore_index": 1.0}, "ignore_index"),
        ({"accum_dtype": torch.int32}, "accum_dtype"),
        ({"lse_square_scale": float("nan")}, "lse_square_scale"),
    ],
)
def test_invalid_options_raise_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        K.FlceOptions(**bad)


def test_options_are_frozen_and_normalised():
    o = K.FlceOptions(label_smoothing=0, softcap=30, max_chunk_mib=512)
    assert o.label_smoothing == 0.0 and isinstance(o.label_smoothing, float) and o.softcap == 30.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.reduction = "sum"
    assert dataclasses.replace(o, reduction="sum").reduction == "sum"


def test_options_object_equals_keywords():
    hidden, weight, target = _inputs()
    opts = K.FlceOptions(label_smoothing=0.1, softcap=4.0, reduction="sum", chunk_mem_const=2)
    a = K.fused_linear_cross_entropy(hidden, weight, target, options=opts)
    b = K.fused_linear_cross_entropy(
        hidden, weight, target, label_smoothing=0.1, softcap=4.0, reduction="sum", chunk_mem_const=2
    )
    ref, _ = flce_reference(hidden, weight, target, label_smoothing=0.1, softcap=4.0, reduction="sum")
    torch.testing.assert_close(a, ref)
    torch.testing.assert_close(b, ref)


def test_field_given_both_ways_is_value_error():
    hidden, weight, target = _inputs()
    with pytest.raises(ValueError, match="softcap given both"):
        K.fused_linear_cross_entropy(hidden, weight, target, options=K.FlceOptions(), softcap=3.0)


def test_unknown_keyword_is_type_error():
    hidden, weight, target = _inputs()
    with pytest.raises(TypeError, match="chunk_size"):
        K.fused_linear_cross_entropy(hidden, weight, target, chunk_size=3)
    with pytest.raises(TypeError, match="FlceOptions"):
        K.fused_linear_cross_entropy(hidden, weight, target, options={"reduction": "sum"})


def test_max_chunk_mib_runs_and_matches():
    hidden, weight, target = _inputs(n=70, v=30)
    loss = K.fused_linear_cross_entropy(hidden, weight, target, max_chunk_mib=30 * 4 * 8 / 2**20)  # 8 rows
    ref, _ = flce_reference(hidden, weight, target)
    torch.testing.assert_close(loss, ref)
    for a, e in zip(
        torch.autograd.grad(loss, [hidden, weight]), torch.autograd.grad(ref, [hidden, weight]), strict=True
    ):
        torch.testing.assert_close(a, e)
