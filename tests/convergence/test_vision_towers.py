"""Vision towers of the multimodal families whose entries patch them: the tower run on images, patched vs unpatched.

The parity suite trains the families on text, which never runs a vision tower; these runs do (fp32 on CPU; bf16
on CUDA when present): the tower's output and the gradient of each of its parameters, patched vs unpatched.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import liger_registry as L
from liger_registry.lint.parity import relative
from liger_registry.testing import tiny_model

HAS_CUDA = torch.cuda.is_available()


@dataclass(frozen=True)
class Tower:
    path: str  # the tower's module path in the family's tiny model
    inputs: Callable[[torch.nn.Module, torch.Generator], dict]
    patched: frozenset[tuple[str, str]]  # (kernel, module path under the tower) the entry must patch


def _glm4v_patches(tower, g) -> dict:
    """Four images' worth of patches ([1, 4, 4] grid), flattened as Glm4vImageProcessor flattens them."""
    config = tower.config
    per_patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    grid = torch.tensor([[1, 4, 4]])
    return {"hidden_states": torch.randn(16, per_patch, generator=g), "grid_thw": grid}


def _images(tower, g) -> dict:
    config = tower.config
    size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    return {"pixel_values": torch.randn(2, config.num_channels, size, size, generator=g)}


def _qwen_vl_patches(tower, g) -> dict:
    """Four merged tokens' worth of patches ([1, 4, 4] grid, merge size 2), flattened as Qwen2-VL's processor does."""
    config = tower.config
    per_patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    return {"hidden_states": torch.randn(16, per_patch, generator=g), "grid_thw": torch.tensor([[1, 4, 4]])}


GLM_NORMS = {"blocks.0.norm1", "blocks.0.norm2", "post_conv_layernorm", "post_layernorm"}
TOWERS = {
    "glm4v": Tower("model.visual", _glm4v_patches, frozenset(("rms_norm", n) for n in GLM_NORMS)),
    "glm4v_moe": Tower(
        "model.visual",
        _glm4v_patches,
        frozenset({*(("rms_norm", n) for n in GLM_NORMS), ("swiglu", "blocks.0.mlp")}),
    ),
    "qwen2_5_vl": Tower(
        "model.visual",
        _qwen_vl_patches,
        frozenset(
            {
                ("rms_norm", "blocks.0.norm1"),
                ("rms_norm", "blocks.0.norm2"),
                ("rms_norm", "merger.ln_q"),
                ("swiglu", "blocks.0.mlp"),
            }
        ),
    ),
    # tiny_config sets norm_type rms_norm and the q/k norms (InternViT-6B's); InternViT-300M's LayerNorms are torch's
    "internvl": Tower(
        "model.vision_tower",
        _images,
        frozenset(
            ("rms_norm", f"encoder.layer.0.{n}")
            for n in ("layernorm_before", "layernorm_after", "attention.q_norm", "attention.k_norm")
        ),
    ),
}


def _run(tower, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tower.zero_grad(set_to_none=True)
    out = tower(**inputs)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
    probe = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1)).to(hidden)
    (hidden.float() * probe.float()).mean().backward()
    grads = {n: p.grad.detach().float().clone() for n, p in tower.named_parameters() if p.grad is not None}
    return hidden.detach().float(), grads


def _check(family: str, device: str, dtype: torch.dtype, tol: float) -> None:
    spec = TOWERS[family]
    model = tiny_model(family, dtype=dtype).to(device)
    model.train()
    tower = model.get_submodule(spec.path)
    inputs = {
        k: v.to(device, dtype) if v.is_floating_point() else v.to(device)
        for k, v in spec.inputs(tower, torch.Generator().manual_seed(0)).items()
    }
    want, want_grads = _run(tower, inputs)
    candidate = copy.deepcopy(model)
    with L.patched(candidate) as handle:
        prefix = spec.path + "."
        patched = {
            (r.kernel, r.target.removeprefix(prefix))
            for r in handle.report.patched
            if r.target.startswith(prefix)
        }
        assert patched == spec.patched, sorted(patched ^ spec.patched)
        got, got_grads = _run(candidate.get_submodule(spec.path), inputs)
    assert got_grads.keys() == want_grads.keys()
    assert relative(got, want) <= tol, f"{family}: tower outputs differ by {relative(got, want):.3g}"
    worst = max(((relative(got_grads[n], g), n) for n, g in want_grads.items()))
    assert worst[0] <= tol, f"{family}: gradients differ by {worst[0]:.3g} ({worst[1]})"


@pytest.mark.parametrize("family", sorted(TOWERS))
def test_cpu_fp32(family: str) -> None:
    _check(family, "cpu", torch.float32, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("family", sorted(TOWERS))
def test_gpu_bf16(family: str) -> None:
    _check(family, "cuda", torch.bfloat16, 2e-2)
