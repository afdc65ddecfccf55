"""Parity suite: every registered family trained patched vs unpatched (fp32 on CPU; bf16 on CUDA when present)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from parity_harness import (
    BF16,
    FP32,
    REGISTRY,
    record,
    record_with_logits,
    run_parity,
    run_with_logits_parity,
)

from liger_registry.registry.loader import LoadedFamily, Registry
from liger_registry.registry.targets import version_problem

FAMILIES = sorted(REGISTRY.families)
# (family, chunk_mem_const): the FLCE constants the reference library found to matter. GPT-OSS's policy sets
# C=8 and the reference mismatched at C=1; Qwen3.5-MoE uses the default C=1 and the reference mismatched at C=8.
C_VARIANTS = [("gpt_oss", 8), ("gpt_oss", 1), ("qwen3_5_moe", 1), ("qwen3_5_moe", 8)]
REQUIRED_C = {("gpt_oss", 8), ("qwen3_5_moe", 1)}  # must pass; the other two are measured and reported
HAS_CUDA = torch.cuda.is_available()
# MoE families whose experts kernel users switch off (moe_experts=False, e.g. to trade its speed for transformers'
# peak): the rest of the patch must keep parity without it. One per experts layout: fused 3-D gate_up (qwen3_moe,
# mixtral) and GPT-OSS's interleaved, biased, clamped one.
MOE_SWITCHED_OFF = ["gpt_oss", "mixtral", "qwen3_moe"]


def _skip_broken(family: str) -> None:
    """The family's `known_broken` field: the original forward itself cannot train here (no parity to measure);
    or its `transformers` range leaves out the installed release (InternLM3: a type 5.17 does not register)."""
    entry = REGISTRY.families[family].entry
    why = entry.broken_on(transformers.__version__) or version_problem(entry)
    if why:
        pytest.skip(why)


def _check(result, tol, required: bool = True) -> None:
    failures = result.failures(tol)
    record(result, "PASS" if not failures else ("FAIL" if required else "FAIL (reported)"))
    assert result.patched, f"{result.family}: nothing was patched"
    if required:
        assert not failures, f"{result.family} ({result.device}, {result.dtype}): " + "; ".join(failures)


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_fp32(family: str) -> None:
    _skip_broken(family)
    _check(run_parity(family, "cpu", torch.float32), FP32)


# On CPU the required pairs are the families' own constants (GPT-OSS's policy C=8, Qwen3.5-MoE's default C=1),
# which test_cpu_fp32 already trains: only the other constant of each family is a run of its own.
CPU_C_VARIANTS = [v for v in C_VARIANTS if v not in REQUIRED_C]


@pytest.mark.parametrize(
    ("family", "chunk_mem_const"), CPU_C_VARIANTS, ids=[f"{f}-C{c}" for f, c in CPU_C_VARIANTS]
)
def test_cpu_fp32_chunk_constants(family: str, chunk_mem_const: int) -> None:
    _check(run_parity(family, "cpu", torch.float32, chunk_mem_const), FP32)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_bf16(family: str) -> None:
    _skip_broken(family)
    _check(run_parity(family, "cuda", torch.bfloat16), BF16)


def _without_experts_kernel(family: str, device: str, dtype: torch.dtype):
    result = run_parity(family, device, dtype, switches={"moe_experts": False})
    assert result.patched and not any(p.startswith("moe_experts:") for p in result.patched), result.patched
    return result


@pytest.mark.parametrize("family", MOE_SWITCHED_OFF)
def test_cpu_fp32_moe_experts_switched_off(family: str) -> None:
    _skip_broken(family)
    _check(_without_experts_kernel(family, "cpu", torch.float32), FP32)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("family", MOE_SWITCHED_OFF)
def test_gpu_bf16_moe_experts_switched_off(family: str) -> None:
    _skip_broken(family)
    _check(_without_experts_kernel(family, "cuda", torch.bfloat16), BF16)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize(("family", "chunk_mem_const"), C_VARIANTS, ids=[f"{f}-C{c}" for f, c in C_VARIANTS])
def test_gpu_bf16_chunk_constants(family: str, chunk_mem_const: int) -> None:
    result = run_parity(family, "cuda", torch.bfloat16, chunk_mem_const)
    _check(result, BF16, required=(family, chunk_mem_const) in REQUIRED_C)


HEADED = [f for f in FAMILIES if REGISTRY.families[f].entry.head is not None]
# CPU: a fixed set covering the head shapes (dense, softcap, logit scale, MoE, multimodal); the GPU runs all.
WITH_LOGITS_CPU = ["llama", "gemma2", "granite", "cohere", "qwen3_moe", "gpt_oss", "qwen2_vl"]


def _check_with_logits(result, tol) -> None:
    failures = result.failures(tol)
    record_with_logits(result, "PASS" if not failures else "FAIL")
    assert result.cross_entropy and result.patched, result
    assert not failures, f"{result.family} ({result.device}, {result.dtype}, with logits): " + "; ".join(
        failures
    )


@pytest.mark.parametrize("family", WITH_LOGITS_CPU)
def test_cpu_fp32_with_logits(family: str) -> None:
    _skip_broken(family)
    _check_with_logits(run_with_logits_parity(family, "cpu", torch.float32, steps=6), FP32)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("family", HEADED)
def test_gpu_bf16_with_logits(family: str) -> None:
    _skip_broken(family)
    _check_with_logits(run_with_logits_parity(family, "cuda", torch.bfloat16), BF16)


def _paligemma_softcaps() -> bool:
    import inspect

    from transformers.models.paligemma import modeling_paligemma

    return "final_logit_softcapping" in inspect.getsource(
        modeling_paligemma.PaliGemmaForConditionalGeneration.forward
    )


@pytest.mark.skipif(not _paligemma_softcaps(), reason="this transformers' PaliGemma head does not softcap")
def test_cpu_fp32_paligemma2_softcap() -> None:
    """PaliGemma 2: a Gemma 2 text model whose final-logit softcap is read through head.text_config_attr."""
    from transformers import Gemma2Config

    from liger_registry.testing import SMALL

    known = Gemma2Config().to_dict()
    text = Gemma2Config(
        **{k: v for k, v in SMALL.items() if k in known}, pad_token_id=0, final_logit_softcapping=2.0
    )
    result = run_parity("paligemma", "cpu", torch.float32, text_config=text)
    result.family = "paligemma2"
    _check(result, FP32)


def test_parity_detects_a_wrong_entry() -> None:
    """The suite can fail: Gemma's norm registered with llama's formula (no +1 offset) breaks parity (its fused
    add + norm, which must agree with rms_norm, registered the same wrong way)."""
    loaded = REGISTRY.families["gemma"]
    entry = loaded.entry
    llama_formula = {"offset": 0.0, "casting_mode": "llama"}
    wrong_norms = {
        name: getattr(entry.kernels, name).model_copy(update=llama_formula)
        for name in ("rms_norm", "add_rms_norm")
    }
    wrong = entry.model_copy(update={"kernels": entry.kernels.model_copy(update=wrong_norms)})
    registry = Registry(
        families={**REGISTRY.families, "gemma": LoadedFamily(wrong, loaded.path)},
        by_model_type=dict(REGISTRY.by_model_type),
        policies=list(REGISTRY.policies),
    )
    result = run_parity("gemma", "cpu", torch.float32, registry=registry)
    assert result.failures(FP32), dataclasses.asdict(result)


def test_every_family_is_covered() -> None:
    """Each model type the registry set out to serve has an entry, and every entry is in the suite."""
    wanted = (
        "llama llama4 llama4_text mllama llava mistral ministral mixtral qwen2 qwen2_moe qwen3 qwen3_moe qwen3_next "
        "qwen3_5 qwen3_5_moe qwen2_vl qwen2_5_vl qwen3_vl gemma gemma2 gemma3_text gemma3 paligemma phi3 granite "
        "gpt_oss olmo2 olmo3 glm4 smollm3 nemotron exaone4 falcon_h1 hunyuan_v1_dense qwen3_5_text qwen3_5_moe_text "
        "qwen2_vl_text qwen2_5_vl_text qwen3_vl_text "
        # added with `liger-registry scaffold`
        "deepseek_v2 deepseek_v3 glm4_moe glm4_moe_lite gemma3n_text gemma4 gemma4_text cohere cohere2 olmo olmoe "
        "granitemoe granitemoeshared granitemoehybrid starcoder2 phi phimoe ernie4_5 ernie4_5_moe minimax seed_oss "
        "hunyuan_v1_moe helium arcee apertus lfm2 exaone_moe dots1 stablelm bitnet jetmoe dbrx internlm3 "
        # the rest of the reference library's types
        "deepseek_v4 glm4v glm4v_moe internvl pixtral smolvlm"
    ).split()
    missing = [t for t in wanted if t not in REGISTRY.by_model_type]
    assert not missing, missing
    assert set(FAMILIES) == set(REGISTRY.families)
