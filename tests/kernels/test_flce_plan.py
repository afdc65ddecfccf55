"""flce_plan: budgets, today's token geometry when tokens are forced, the strategy the cost model picks."""

import pytest
import torch

from liger_registry import kernels as K
from liger_registry.kernels.flce import plan as flce_plan
from liger_registry.kernels.flce.plan import fits, vocab_geometry

LLAMA = (4096, 128256)


@pytest.mark.parametrize("c,chunk,n", [(1, 256, 32), (8, 2048, 4), (16, 4096, 2)])
def test_forced_tokens_is_todays_geometry(c, chunk, n):
    plan = K.flce_plan(8192, *LLAMA, chunk_mem_const=c, strategy="tokens")
    assert (plan.strategy, plan.chunk_tokens, plan.num_chunks) == ("tokens", chunk, n)
    assert (plan.chunk_tokens, plan.num_chunks) == K.flce_chunk_geometry(8192, *LLAMA, c)
    assert plan.chunk_vocab == LLAMA[1]
    assert plan.buffer_mib == pytest.approx(chunk * LLAMA[1] * 2 / 2**20) == plan.budget_mib


def test_tokens_with_mib_budget_is_largest_multiple_of_128_within():
    plan = K.flce_plan(8192, *LLAMA, max_chunk_mib=512, strategy="tokens")
    assert plan.chunk_tokens == 2048 and plan.buffer_mib <= 512 < 2176 * LLAMA[1] * 2 / 2**20
    gpt = K.flce_plan(8192, 2880, 201088, max_chunk_mib=512, strategy="tokens")
    assert (gpt.chunk_tokens, gpt.num_chunks) == (
        1280,
        7,
    ) and gpt.buffer_mib <= 512 < 1408 * 201088 * 2 / 2**20
    assert K.flce_plan(16384, 2880, 201088, max_chunk_mib=512, strategy="tokens").num_chunks == 13
    assert K.flce_plan(8192, *LLAMA, max_chunk_mib=20, strategy="tokens").chunk_tokens == 64  # < 128 rows fit
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


def test_planner_picks_vocab_at_2k_and_tokens_at_16k_tokens():
    small = K.flce_plan(2048, *LLAMA, chunk_mem_const=1, gpu="NVIDIA H200")
    large = K.flce_plan(16384, *LLAMA, chunk_mem_const=1, gpu="NVIDIA H200")
    assert small.strategy == "vocab" and "predicted vocab" in small.why
    assert large.strategy == "tokens" and "predicted tokens" in large.why
    assert small.chunk_tokens == 2048 and small.chunk_vocab % 8 == 0
    # N <= H: every chunk kept in dW's memory for pass 2, 6 chunks (the widest 63488 columns), none recomputed
    assert (small.scratch, small.pass1_chunks, small.num_chunks, small.widest) == (True, 6, 6, 63488)
    assert small.recomputed == 0 and "0 recomputed" in str(small)
    at_4k = K.flce_plan(4096, *LLAMA, chunk_mem_const=1, gpu="NVIDIA H200")  # N = H: 33 chunks, all kept
    assert (at_4k.pass1_chunks, at_4k.num_chunks, at_4k.recomputed) == (33, 33, 0)
    at_8k = K.flce_plan(
        8192, *LLAMA, chunk_mem_const=1, strategy="vocab", gpu="NVIDIA H200"
    )  # N > H: one kept
    assert (at_8k.pass1_chunks, at_8k.num_chunks, at_8k.recomputed) == (3, 9, 85504)
    frozen = K.flce_plan(2048, *LLAMA, chunk_mem_const=1, gpu="NVIDIA H200", weight_grad=False)
    assert not frozen.scratch and frozen.num_chunks == -(-LLAMA[1] // frozen.chunk_vocab)
    assert "dW's memory" in str(small) and "dW" not in str(frozen)
    # the same on the default figures (a CPU-only machine plans for a generic GPU)
    assert K.flce_plan(2048, *LLAMA, gpu=None).strategy == "vocab"


@pytest.mark.parametrize("bt", [1, 7, 300, 2048, 4096, 8192, 16384, 65536])
@pytest.mark.parametrize("budget", [{}, {"chunk_mem_const": 8}, {"max_chunk_mib": 512}, {"max_chunk_mib": 3}])
@pytest.mark.parametrize("strategy", ["auto", "tokens", "vocab"])
@pytest.mark.parametrize("shape", [LLAMA, (2880, 201088), (64, 50)])
@pytest.mark.parametrize("weight_grad", [True, False])
def test_plan_never_exceeds_the_budget(bt, budget, strategy, shape, weight_grad):
    try:
        plan = K.flce_plan(bt, *shape, strategy=strategy, weight_grad=weight_grad, **budget)
    except ValueError as e:
        assert "smaller than one row" in str(e)
        return
    assert plan.buffer_mib <= plan.budget_mib + 1e-9
    if plan.scratch:  # the budget buffer holds only the narrow chunks; the wide ones live in dW's memory
        geometry = vocab_geometry(bt, shape[0], shape[1], plan.chunk_vocab, True)
        assert weight_grad and fits(geometry, bt, *shape) and plan.num_chunks == len(geometry.pass2)
        assert plan.buffer_mib == pytest.approx(bt * geometry.buffer_cols * 2 / 2**20)
        assert geometry.buffer_cols <= plan.chunk_vocab <= plan.widest
        assert plan.recomputed == geometry.recomputed
        if plan.recomputed:  # one chunk kept: it is wider than the buffer
            assert plan.chunk_vocab < plan.widest
        else:  # every chunk kept: N <= H
            assert bt <= shape[0] and all(c.reuse for c in geometry.pass2)
        return
    assert plan.chunk_tokens * plan.chunk_vocab * 2 / 2**20 == pytest.approx(plan.buffer_mib)
    if plan.strategy == "tokens":
        assert plan.chunk_vocab == shape[1] and plan.num_chunks == -(-bt // plan.chunk_tokens)
    else:
        assert plan.chunk_tokens == bt and plan.num_chunks == -(-shape[1] // plan.chunk_vocab)
        if plan.chunk_vocab < shape[1]:
            assert plan.chunk_vocab % 128 == 0 and plan.chunk_vocab >= 128
            widest = int(plan.budget_mib * 2**20 // (bt * 2)) // 128 * 128  # even chunks: no fewer would fit
            assert plan.num_chunks == -(-shape[1] // widest)
    if strategy != "auto" and plan.strategy != strategy:
        assert "infeasible" in plan.why


def test_vocab_infeasible_falls_back_to_tokens_and_says_why():
    plan = K.flce_plan(65536, *LLAMA, max_chunk_mib=3, strategy="vocab")
    assert plan.strategy == "tokens" and "vocab infeasible" in plan.why and "65536 rows" in plan.why


@pytest.mark.parametrize(
    "bt,shape,c,width,n",
    [
        (
            8192,
            LLAMA,
            1,
            3968,
            33,
        ),  # the C=1 budget holds 4008 columns x 8192 rows; 3968 is the multiple of 128
        (2048, LLAMA, 1, 3968, 33),
        (16384, LLAMA, 1, 3968, 33),
        (2048, (2880, 201088), 1, 3072, 66),
        (8192, (2880, 201088), 8, 22400, 9),
    ],
)
def test_vocab_chunks_are_even(bt, shape, c, width, n):
    plan = K.flce_plan(bt, *shape, chunk_mem_const=c, strategy="vocab", weight_grad=False)
    assert (plan.chunk_vocab, plan.num_chunks) == (width, n)
    assert (n - 1) * width < shape[1] <= n * width and plan.buffer_mib <= plan.budget_mib


# bench_flce on the H200 (bf16 fwd + bwd ms, old vocab geometry 33 x 3968 / 66 x 3072 without the reuse): the points
# the vocab constants were fitted to, docs/design/flce-cost-model.md
MEASURED_VOCAB_MS = {
    (2048, LLAMA): 14.35,
    (4096, LLAMA): 27.90,
    (8192, LLAMA): 55.39,
    (2048, (2880, 201088)): 16.92,
    (4096, (2880, 201088)): 32.42,
    (8192, (2880, 201088)): 63.22,
    (16384, (2880, 201088)): 125.80,
}
MEASURED_TOKENS_MS = {(8192, LLAMA): 54.97, (16384, LLAMA): 90.67}


@pytest.mark.parametrize("bt,shape", list(MEASURED_VOCAB_MS))
def test_cost_model_reproduces_the_h200_vocab_timings(bt, shape, monkeypatch):
    from liger_registry.kernels.flce import plan as flce_plan

    monkeypatch.setattr(flce_plan, "REUSE_LAST_CHUNK", False)
    old_width = 3968 if shape == LLAMA else 3072
    peaks = flce_plan.peaks_for("NVIDIA H200")
    ms = flce_plan.vocab_ms(bt, *shape, old_width, 2, peaks) - flce_plan.target_logit_ms(
        bt, shape[0], 2, peaks
    )
    assert ms == pytest.approx(MEASURED_VOCAB_MS[bt, shape], rel=0.02)


@pytest.mark.parametrize(
    "bt,shape,pick",
    [
        (2048, LLAMA, "vocab"),
        (4096, LLAMA, "vocab"),
        (8192, LLAMA, "tokens"),  # measured 54.97 tokens vs 55.39 vocab: the faster one
        (16384, LLAMA, "tokens"),
        (2048, (2880, 201088), "vocab"),
        (8192, (2880, 201088), "vocab"),
        (16384, (2880, 201088), "vocab"),
    ],
)
def test_planner_picks_the_faster_strategy_at_the_h200_points(bt, shape, pick):
    """The run-1 geometry (budget-buffer chunks only: what a frozen head gets today)."""
    plan = K.flce_plan(bt, *shape, chunk_mem_const=1, gpu="NVIDIA H200", weight_grad=False)
    assert plan.strategy == pick, plan
    tokens = K.flce_plan(bt, *shape, chunk_mem_const=1, strategy="tokens", gpu="NVIDIA H200")
    if (bt, shape) in MEASURED_TOKENS_MS:
        assert tokens.predicted_ms == pytest.approx(MEASURED_TOKENS_MS[bt, shape], rel=0.025)


# bench_flce on the H200 (bf16 fwd + bwd ms): the vocab strategy with its widest chunks in dW's memory
# (docs/design/flce-layouts.md, scratch geometry)
MEASURED_SCRATCH_MS = {
    (2048, LLAMA): 11.42,
    (4096, LLAMA): 23.39,
    (8192, LLAMA): 49.51,
    (2048, (2880, 201088)): 13.46,
    (4096, (2880, 201088)): 27.78,
    (8192, (2880, 201088)): 57.05,
    (16384, (2880, 201088)): 120.80,
}


@pytest.mark.parametrize("bt,shape", list(MEASURED_SCRATCH_MS))
def test_cost_model_reproduces_the_h200_scratch_timings_and_picks_it(bt, shape):
    """Within 5% of the scratch-geometry timings (the model runs 1-4% fast on GPT-OSS), and the planner picks it at the C=1 budget where
    it measured faster than tokens (Llama 16384: tokens 97.7 vs vocab 114.6 ms; picked tokens)."""
    plan = K.flce_plan(bt, *shape, chunk_mem_const=1, strategy="vocab", gpu="NVIDIA H200")
    one_kept = flce_plan.vocab_ms(
        bt, shape[0], shape[1], plan.chunk_vocab, 2, flce_plan.peaks_for("H200"), True, 128, keep=False
    )
    assert plan.scratch and one_kept == pytest.approx(MEASURED_SCRATCH_MS[bt, shape], rel=0.05)
    assert plan.predicted_ms <= one_kept  # the kept geometry where N <= H (measured below)
    assert K.flce_plan(bt, *shape, chunk_mem_const=1, gpu="NVIDIA H200").strategy == "vocab"
    assert K.flce_plan(16384, *LLAMA, chunk_mem_const=1, gpu="NVIDIA H200").strategy == "tokens"


QWEN3 = (4096, 151936)
# bench_flce on the H200 (bf16 fwd + bwd ms, the C=1 budget): every chunk kept (N <= H) vs pass 1's last only
# (docs/design/flce-layouts.md, kept geometry)
KEPT_RUNS = {
    (2048, LLAMA): (10.06, 10.99),
    (3072, LLAMA): (15.08, 16.88),
    (4096, LLAMA): (21.28, 23.01),  # 33 chunks
    (2048, QWEN3): (12.05, 13.17),
    (3072, QWEN3): (18.06, 19.96),
    (4096, QWEN3): (25.00, 27.50),
    (2048, (2880, 201088)): (11.70, 13.00),
}


@pytest.mark.parametrize("bt,shape", list(KEPT_RUNS))
def test_cost_model_chooses_the_kept_layout_where_it_measured_faster(bt, shape):
    """Both layouts predicted within 5% of the H200, and the plan takes the kept one (no logits recomputed)."""
    peaks = flce_plan.peaks_for("NVIDIA H200")
    plan = K.flce_plan(bt, *shape, chunk_mem_const=1, strategy="vocab", gpu="NVIDIA H200")
    kept, one_kept = (
        flce_plan.vocab_ms(bt, *shape, plan.chunk_vocab, 2, peaks, True, 128, keep=k) for k in (True, False)
    )
    assert (kept, one_kept) == pytest.approx(KEPT_RUNS[bt, shape], rel=0.05)
    assert flce_plan.keeps_every_chunk(bt, *shape, plan.chunk_vocab, 2, peaks, 128)
    assert plan.recomputed == 0 and plan.predicted_ms == pytest.approx(kept)


def test_kept_layout_is_refused_where_its_extra_chunks_cost_more_than_the_gemms_it_saves():
    """N = H with a quarter of the C=1 budget: 63 kept chunks. A card with free GEMMs and slow memory pays for
    every chunk's fp32 dX pass and saves nothing: the one-kept layout, and the run follows the plan."""
    membound = flce_plan.DevicePeaks("membound", 1e18, 1e11)
    assert not flce_plan.keeps_every_chunk(4096, *LLAMA, 2048, 2, membound, 128)
    assert flce_plan.keeps_every_chunk(4096, *LLAMA, 2048, 2, flce_plan.peaks_for("H200"), 128)
    assert not flce_plan.keeps_every_chunk(8192, *LLAMA, 3968, 2, flce_plan.peaks_for("H200"), 128)  # N > H


def test_an_unknown_gpu_name_is_refused_with_the_known_ones():
    """A GPU named on purpose is never costed for the generic peaks silently (the CLI's --gpu likewise)."""
    with pytest.raises(ValueError, match="unknown GPU 'RTX9999'; known: H200"):
        K.flce_plan(2048, *LLAMA, gpu="RTX9999")
    assert K.flce_plan(2048, *LLAMA, gpu="NVIDIA H100 80GB HBM3").strategy in ("tokens", "vocab")


def test_plan_says_its_gemms_and_the_gradients_it_holds():
    """The token strategy runs the three GEMMs of the floor; the vocab strategy adds its recomputed columns'
    logits. Both hold dW + dX from the forward to the backward; the predicted peaks are the measured ones
    (docs/design/head-memory.md: Llama-3 8192 vocab 1194.5 MiB on the H100; ANCHORS: 16384 tokens 1255)."""
    mib = 2**20
    dw, dx = 128256 * 4096 * 2 / mib, 4096 * 2 / mib
    tokens = K.flce_plan(16384, *LLAMA, gpu="NVIDIA H200")
    assert tokens.strategy == "tokens" and tokens.gemms == 3.0
    assert tokens.held_mib == pytest.approx(dw + 16384 * dx)
    assert tokens.peak_mib == pytest.approx(dw + 16384 * dx + tokens.buffer_mib)
    assert abs(tokens.peak_mib - 1255.0) < 1.0
    vocab = K.flce_plan(8192, *LLAMA, gpu="NVIDIA H100")
    assert vocab.strategy == "vocab" and vocab.recomputed == 85504
    assert vocab.gemms == pytest.approx(3 + 85504 / 128256)
    assert vocab.held_mib == pytest.approx(dw + 8192 * dx)
    assert abs(vocab.peak_mib - 1194.5) < 5.0  # dW + the fp32 dX accumulator + max(buffer, dX)
    assert "3.00 head-sized GEMMs" in str(tokens) and "held forward to backward 1130.0 MiB" in str(tokens)


def test_reduction_none_forms_the_gradients_in_the_backward_and_says_why():
    mean = K.flce_plan(16384, *LLAMA, gpu="NVIDIA H200")
    none = K.flce_plan(16384, *LLAMA, gpu="NVIDIA H200", reduction="none")
    assert (none.strategy, none.chunk, none.num_chunks) == (mean.strategy, mean.chunk, mean.num_chunks)
    assert none.gemms == mean.gemms + 1 and none.held_mib == 0.0
    assert "reduction=none" in none.why and "reduction=none" not in mean.why
    with pytest.raises(ValueError, match="reduction"):
        K.flce_plan(16384, *LLAMA, reduction="avg")


def test_plan_memory_of_a_frozen_head_and_an_fp32_accumulator():
    mib = 2**20
    frozen = K.flce_plan(16384, *LLAMA, gpu="NVIDIA H200", strategy="tokens", weight_grad=False)
    assert frozen.gemms == 2.0 and frozen.held_mib == pytest.approx(16384 * 4096 * 2 / mib)
    fp32 = K.flce_plan(16384, *LLAMA, gpu="NVIDIA H200", strategy="tokens", accum_dtype=torch.float32)
    bf16 = K.flce_plan(16384, *LLAMA, gpu="NVIDIA H200", strategy="tokens")
    # the fp32 accumulator and its cast to the weight's dtype are alive together at the end
    assert fp32.peak_mib - bf16.peak_mib == pytest.approx(128256 * 4096 * 4 / mib)
    assert fp32.held_mib == bf16.held_mib


def test_plan_for_reads_reduction_and_accum_dtype_from_the_options():
    from liger_registry.kernels.flce.plan import plan_for

    cpu = torch.device("cpu")
    opts = K.FlceOptions(reduction="none", accum_dtype=torch.float32, strategy="tokens")
    plan = plan_for(16384, *LLAMA, opts, torch.bfloat16, cpu)
    default = plan_for(16384, *LLAMA, K.FlceOptions(strategy="tokens"), torch.bfloat16, cpu)
    assert plan.held_mib == 0.0 and plan.gemms == default.gemms + 1
    assert plan.peak_mib > default.peak_mib
