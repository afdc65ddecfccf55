"""flce_plan: budgets, today's token geometry when tokens are forced, the strategy the cost model picks."""

import pytest
import torch

from liger_registry import kernels as K

LLAMA = (4096, 128256)


@pytest.mark.parametrize("c,chunk,n", [(1, 256, 32), (8, 2048, 4), (16, 4096, 2)])
def test_forced_tokens_is_todays_geometry(c, chunk, n):
    plan = K.flce_plan(8192, *LLAMA, chunk_mem_const=c, strategy="tokens")
    assert (plan.strategy, plan.chunk_tokens, plan.num_chunks) == ("tokens", chunk, n)
    assert (plan.chunk_tokens, plan.num_chunks) == K.flce_chunk_geometry(8192, *LLAMA, c)
    assert plan.chunk_vocab == LLAMA[1]
    assert plan.buffer_mib == pytest.approx(chunk * LLAMA[1] * 2 / 2**20) == plan.budget_mib


def test_tokens_with_mib_budget_is_largest_power_of_two_within():
    plan = K.flce_plan(8192, *LLAMA, max_chunk_mib=512, strategy="tokens")
    assert plan.chunk_tokens == 2048 and plan.buffer_mib <= 512 < 4096 * LLAMA[1] * 2 / 2**20
    assert K.flce_plan(100, *LLAMA, max_chunk_mib=512, strategy="tokens").chunk_tokens == 100
    with pytest.raises(ValueError, match="smaller than one row"):
        K.flce_plan(100, *LLAMA, max_chunk_mib=0.1, strategy="tokens")


def test_plan_argument_checks():
    with pytest.raises(ValueError, match="one budget knob"):
        K.flce_plan(10, 4, 8, chunk_mem_const=1, max_chunk_mib=1)
    with pytest.raises(ValueError, match="chunk_mem_const"):
        K.flce_plan(10, 4, 8, chunk_mem_const=0)
    with pytest.raises(ValueError, match="strategy"):
        K.flce_plan(10, 4, 8, strategy="x")
    with pytest.raises(ValueError, match="bt"):
        K.flce_plan(-1, 4, 8)


def test_plan_str_and_fp32_itemsize():
    plan = K.flce_plan(8192, *LLAMA, strategy="tokens", dtype=torch.float32)
    assert plan.buffer_mib == pytest.approx(256 * LLAMA[1] * 4 / 2**20)
    assert str(plan).startswith("tokens: 32 x [256, 128256] logits chunks")
