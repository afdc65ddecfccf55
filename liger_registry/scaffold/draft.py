"""Drafts a FamilyEntry for a model type from its tiny model: kernels where the numbers match, reasons elsewhere."""

from __future__ import annotations

import copy
import difflib
import inspect as pyinspect
import itertools
import linecache
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from liger_registry.registry.loader import LoadedFamily, Registry
from liger_registry.scaffold import decide
from liger_registry.scaffold.inspect import (
    Captured,
    ModelSource,
    capture_inputs,
    model_source,
    module_classes,
    record_calls,
    rotary_functions,
    target_name,
)
from liger_registry.schemas import FamilyEntry
from liger_registry.testing import SMALL

# Sizes beyond liger_registry.testing.SMALL that MoE and MLA configs name differently (only keys a config has).
EXTRA_SMALL = {
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "moe_num_experts": 4,
    "num_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "shared_expert_intermediate_size": 32,
    "moe_num_shared_experts": 1,
    "moe_k": 2,
    "num_kv_shared_layers": 0,
    "num_dense_layers": 1,  # LFM2-MoE: the sparse layers come after these, and SMALL has two layers
    "vocab_size_per_layer_input": 128,
    "hidden_size_per_layer_input": 8,
    # Mamba-2 mixers: heads * head_dim = d_ssm = expand (2) * hidden_size (SMALL's 32).
    "mamba_n_heads": 8,
    "mamba_d_head": 8,
    "mamba_d_ssm": 64,
    "mamba_d_state": 8,
    "mamba_n_groups": 1,
    "mamba_chunk_size": 8,
}
# Set even where the default is None (the constructor needs a number).
REQUIRED_SMALL = ("n_routed_experts", "n_shared_experts")
# A multimodal model's other towers (vision, audio) made small too; they are built, never run, by the checks.
SUB_SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "depth": 1,
    "num_attention_heads": 2,
    "num_heads": 2,
    "num_key_value_heads": 2,
    "embed_dim": 32,
    "out_hidden_size": 32,
    "ffn_hidden_size": 64,  # DBRX's ffn_config
}
# Every float knob of the tiny config gets a value no other knob has, none the reciprocal of another: a proof on
# equal values cannot tell which attribute a formula reads (the attention softcap for the final one).
KNOB_VALUES = (1.5, 0.7, 1.3, 2.0, 0.6, 1.75, 0.9, 1.2, 0.8, 2.5)
# Softcaps this small still bend tiny-model logits measurably, without saturating tanh (which would leave
# gradients of only rounding noise for AdamW to amplify in the parity suite).
SOFTCAP_VALUES = (5.0, 6.5, 8.0, 9.5)
# Epsilons large enough beside a tiny model's activations (embeddings of std 0.02) that a norm using another
# one differs beyond fp32 tolerance.
EPS_VALUES = (1e-4, 2e-4, 3e-4, 4e-4)
ROPE_THETAS = (1000.0, 1500.0, 2500.0)
_KNOB = re.compile(r"multiplier|scaling|logit_scale|softcap")
_EPS = re.compile(r"(^|_)eps(ilon)?($|_)")
MAX_PARAMETERS = 20_000_000
SCAFFOLD_PATH = Path("<scaffold>")


class Refused(Exception):
    """The scaffold cannot draft an entry; the message says why."""


class MissingConfig(Refused):
    """The default config leaves unset (None) fields that the model's code needs: `--set FIELD=VALUE` gives them."""

    def __init__(self, stage: str, fields: dict[str, str]) -> None:
        self.fields = fields  # field -> the code that reads it
        needs = "; ".join(f"{name} (read by {where})" for name, where in fields.items())
        given = " ".join(f"--set {name}=VALUE" for name in fields)
        super().__init__(
            f"{stage}: the default config leaves {', '.join(fields)} unset (None), and the model's code needs "
            f"{'it' if len(fields) == 1 else 'them'}: {needs}. Give the value a checkpoint uses: {given}"
        )


_CONFIG_READ = re.compile(r"\bconfig\.(\w+)")
_SELF_READ = re.compile(r"\bself\.(\w+)")


def _frames(exc: BaseException) -> list[tuple[Any, int]]:
    """(frame, line number) of each step of the traceback of `exc`, innermost first."""
    found, tb = [], exc.__traceback__
    while tb is not None:
        found.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return found[::-1]


def _config_names(frame: Any, line: str) -> list[str]:
    """Config fields a line reads: `config.x` itself, or `self.x` where the function set `self.x = config.y`
    before it (Qwen4ExpTextQSAIndexer's `self.token_budget // self.compress_ratio`)."""
    names = _CONFIG_READ.findall(line)
    try:
        source = pyinspect.getsource(frame.f_code)
    except (OSError, TypeError):
        return names
    aliases = dict(re.findall(r"self\.(\w+)\s*=\s*(?:self\.)?config\.(\w+)\s*$", source, re.M))
    return names + [aliases[n] for n in _SELF_READ.findall(line) if n in aliases]


def missing_fields(exc: BaseException, configs: list[Any]) -> dict[str, str]:
    """Config fields that are None in every one of `configs` and are read on a line of the traceback of `exc`
    (innermost first), each with that line: the fields whose absence raised it."""
    found: dict[str, str] = {}
    for frame, lineno in _frames(exc):
        line = linecache.getline(frame.f_code.co_filename, lineno).strip()
        for name in _config_names(frame, line):
            known = [c for c in configs if name in c.to_dict()]
            if known and all(getattr(c, name, None) is None for c in known) and name not in found:
                found[name] = f"{Path(frame.f_code.co_filename).name}:{lineno} `{line[:100]}`"
    return found


def refusal(stage: str, exc: Exception, configs: list[Any], sep: str = ": ") -> Refused:
    """Why `stage` failed: the unset config fields it needs where the traceback shows them, else the error."""
    if fields := missing_fields(exc, configs):
        return MissingConfig(stage, fields)
    return Refused(f"{stage}{sep}{type(exc).__name__}: {first_line(exc)}")


@dataclass
class Draft:
    entry: FamilyEntry
    notes: list[str] = field(default_factory=list)  # what the entry leaves as it is, and why
    refusals: list[str] = field(default_factory=list)

    def registry(self, base: Registry | None = None) -> Registry:
        return single_family_registry(self.entry, base)


def single_family_registry(
    entry: FamilyEntry, base: Registry | None = None, path: Path = SCAFFOLD_PATH
) -> Registry:
    """A registry that serves only `entry` (with the bundled policies of `base`)."""
    loaded = LoadedFamily(entry, path)
    policies = list(base.policies) if base is not None else []
    return Registry({entry.family: loaded}, dict.fromkeys(entry.model_types, entry.family), policies)


def _text_attr(config: PretrainedConfig) -> str | None:
    text = config.get_text_config()
    if text is config:
        return None
    return next((k for k, v in vars(config).items() if v is text), None)


def _shrunk(config: PretrainedConfig, values: dict[str, Any]) -> dict[str, Any]:
    known = config.to_dict()
    return {k: v for k, v in values.items() if k in known and (known[k] is not None or k in REQUIRED_SMALL)}


def _aliased_small(config: PretrainedConfig) -> dict[str, Any]:
    """SMALL's sizes under the config's own names where it aliases them (GPT-2's n_embd for hidden_size)."""
    aliases = getattr(config, "attribute_map", {}) or {}
    known = config.to_dict()
    return {aliases[k]: v for k, v in SMALL.items() if k in aliases and aliases[k] in known}


# `self.layer_types = ["full_attention" if i in self.full_attn_idxs else "conv" for ...]` (a configuration), and
# `config.layer_types[layer_idx] != "conv"` (a modeling module).
_KIND_CHOICE = re.compile(
    r"(?<!\w)layer_types\s*=\s*\[\s*[\"'](\w+)[\"']\s+if\s+[^\n]*?\s+else\s+[\"'](\w+)[\"']"
)
_KIND_TEST = re.compile(r"(?<!\w)layer_types\[[^\]]*\]\s*[!=]=\s*[\"'](\w+)[\"']")


def _other_layer_kind(kinds: set[str], source: str) -> str | None:
    """Another kind of block (a convolution, a recurrence) that the code builds and the default config does not
    use (LFM2 defaults to attention layers only; checkpoints interleave "conv" layers). Never another attention
    mask: a sliding layer needs a window the default may leave unset."""
    found = [k for pair in _KIND_CHOICE.findall(source) if kinds & set(pair) for k in pair]
    found += _KIND_TEST.findall(source)
    other = next((k for k in found if k not in kinds and "attention" not in k), None)
    if other is None and kinds == {"linear_attention"}:
        # A hybrid whose default has no attention layer: its cache cannot serve the model (transformers raises
        # in get_seq_length), and the attention path would go unchecked.
        return "full_attention"
    return other


def _per_layer_lists(config: PretrainedConfig, module_source: str = "") -> dict[str, list]:
    """Lists with one value per layer cut to SMALL's layer count, keeping two different kinds of layer where the
    model has them (a hybrid's attention and its linear layers both get built and run)."""
    layers, small = getattr(config, "num_hidden_layers", None), SMALL["num_hidden_layers"]
    values = config.to_dict()
    cut = {}
    for name, value in values.items():
        if not (
            isinstance(value, list) and isinstance(layers, int) and layers > small and len(value) == layers
        ):
            continue
        other = next((v for v in value if v != value[0]), value[0])
        cut[name] = [value[0]] * (small - 1) + [other]
        if name in SMALL and len(set(value)) == 1:  # a size given per layer (Gemma 3n's intermediate_size)
            cut[name] = [SMALL[name]] * small
        if (
            name == "layer_types"
            and len(set(value)) == 1
            and (kind := _other_layer_kind(set(value), module_source))
        ):
            cut[name] = [kind] * (small - 1) + [value[0]] if kind != "full_attention" else [value[0], kind]
    types, cut_types = values.get("layer_types"), cut.get("layer_types")
    for (
        name,
        value,
    ) in values.items():  # index lists of one kind of layer (LFM2's full_attn_idxs) follow the cut
        if "idx" in name and isinstance(value, list) and types and cut_types:
            kind = next((k for k in set(types) if value == [i for i, t in enumerate(types) if t == k]), None)
            if kind is not None:
                cut[name] = [i for i, t in enumerate(cut_types) if t == kind]
    return cut


def _structural(config: PretrainedConfig) -> dict[str, Any]:
    """Dropout off (the checks compare two runs), and multi-head latent attention without grouped k/v heads."""
    values = {k: 0.0 for k, v in config.to_dict().items() if "drop" in k and isinstance(v, float) and v > 0}
    rope = config.to_dict().get("rope_parameters") or {}
    if rope.get("partial_rotary_factor") == 1.0:
        # A knob whose default hides a code path (Phi-3's 1.0; Phi-4-mini ships 0.75): the partial one is checked.
        values["rope_parameters"] = {**rope, "partial_rotary_factor": 0.5}
    theta = rope.get("rope_theta")
    for name, sub in vars(config).items():
        # DBRX's attention reads attn_config.rope_theta, which transformers 5's default sub-config lacks
        # (checkpoints carry it): give it the model's own theta.
        attention = "attn" in name or "attention" in name
        if (
            isinstance(sub, PretrainedConfig)
            and attention
            and theta is not None
            and "rope_theta" not in vars(sub)
        ):
            values[name] = {"rope_theta": theta}
    if config.to_dict().get("kv_lora_rank") is not None:
        values["num_key_value_heads"] = SMALL["num_attention_heads"]
    return values


class Distinct:
    """Hands out values no knob of the tiny config has yet (nor its reciprocal): from a pool, then beyond it."""

    def __init__(self) -> None:
        self.used: list[float] = []

    def take(self, pool: tuple[float, ...]) -> float:
        # beyond the pool: 5 % steps up from its first value, near the values the pool was chosen around
        beyond = (float(f"{pool[0] * (1 + 0.05 * (k + 1)):.6g}") for k in itertools.count())
        for value in itertools.chain(pool, beyond):
            if all(not math.isclose(value, u) and not math.isclose(value * u, 1.0) for u in self.used):
                self.used.append(value)
                return value
        raise AssertionError("unreachable: the values beyond the pool are unbounded")


def _knob_pool(name: str) -> tuple[float, ...] | None:
    if "softcap" in name:
        return SOFTCAP_VALUES
    if _EPS.search(name):
        return EPS_VALUES
    return KNOB_VALUES if _KNOB.search(name) else None


def _rope_thetas(rope: dict[str, Any], distinct: Distinct) -> dict[str, Any]:
    """rope_parameters with each rope_theta (one, or one per layer type) given a distinct value."""
    out = dict(rope)
    if isinstance(out.get("rope_theta"), (int, float)):
        out["rope_theta"] = distinct.take(ROPE_THETAS)
    for key, sub in rope.items():
        if isinstance(sub, dict) and isinstance(sub.get("rope_theta"), (int, float)):
            out[key] = {**sub, "rope_theta": distinct.take(ROPE_THETAS)}
    return out


def _scale_knobs(text: PretrainedConfig, rope: dict[str, Any] | None = None) -> dict[str, Any]:
    """Multipliers, scales, softcaps, epsilons and rope thetas of the config set to values distinct from each
    other and other than 1, so that a formula that uses one is told apart from one that uses another, or none
    (a default of 1.0 or None hides them). `rope`: the rope_parameters the tiny config already sets."""
    knobs: dict[str, Any] = {}
    distinct = Distinct()
    for name, value in sorted(text.to_dict().items()):
        if (pool := _knob_pool(name)) is None or isinstance(value, bool):
            continue
        if isinstance(value, float) or (pool is SOFTCAP_VALUES and value is None):
            knobs[name] = distinct.take(pool)
        elif isinstance(value, list) and value and all(isinstance(v, float) for v in value):
            knobs[name] = [distinct.take(pool) for _ in value]
    rope = rope if rope is not None else text.to_dict().get("rope_parameters")
    if isinstance(rope, dict) and (thetas := _rope_thetas(rope, distinct)) != rope:
        knobs["rope_parameters"] = thetas
    return knobs


def tiny_overrides(config: PretrainedConfig, module_source: str = "") -> tuple[dict[str, Any], list[str]]:
    """The entry's tiny_config (over testing.SMALL) and the head candidates: scalar knobs it sets."""
    text_attr = _text_attr(config)
    text = config.get_text_config()
    text_values = {
        **_aliased_small(text),
        **_shrunk(text, EXTRA_SMALL),
        **_per_layer_lists(text, module_source),
        **_structural(text),
    }
    pad = getattr(text, "pad_token_id", None)
    if isinstance(pad, int) and pad >= SMALL["vocab_size"]:
        text_values["pad_token_id"] = 0
    if text_attr is None and getattr(config, "tie_word_embeddings", False):
        text_values["tie_word_embeddings"] = True
    for name, sub in vars(text).items():  # a text model's own sub-configs (DBRX's ffn_config and attn_config)
        if not isinstance(sub, PretrainedConfig):
            continue
        small = _shrunk(sub, SUB_SMALL)
        if "clip_qkv" in sub.to_dict() and sub.clip_qkv is None:
            # DBRX clamps q/k/v by it and its forward raises on the default None; checkpoints set 8.
            small["clip_qkv"] = 8.0
        if small:
            text_values[name] = {**text_values.get(name, {}), **small}
    knobs = _scale_knobs(text, text_values.get("rope_parameters"))
    text_values.update(knobs)
    candidates = [k for k, v in knobs.items() if isinstance(v, float) and _KNOB.search(k)]
    if text_attr is None:
        return text_values, candidates
    overrides: dict[str, Any] = {text_attr: text_values} if text_values else {}
    for name, sub in vars(config).items():
        if isinstance(sub, PretrainedConfig) and name != text_attr and (small := _shrunk(sub, SUB_SMALL)):
            overrides[name] = small
    return overrides, candidates


def _base_entry(source: ModelSource, family: str, tiny: dict[str, Any], forward: str) -> FamilyEntry:
    return FamilyEntry(
        family=family,
        model_types=[source.model_type],
        module=source.module_name,
        causal_lm=source.causal_lm.__name__,
        forward=forward,
        tiny_config=tiny,
    )


def _configs(entry: FamilyEntry) -> list[PretrainedConfig]:
    """The entry's tiny config and its language config (where a missing field may be looked up)."""
    from liger_registry.testing import tiny_config

    try:
        config = tiny_config(entry.model_types[0], single_family_registry(entry))
    except Exception:  # noqa: BLE001 - the defaults then: the fields a tiny config leaves unset are theirs
        config = AutoConfig.for_model(entry.model_types[0])
    return [config, config.get_text_config()]


def build_tiny(entry: FamilyEntry) -> nn.Module:
    """The entry's tiny model; refused when it cannot be built or is not tiny (towers the sizes miss)."""
    from liger_registry.registry.targets import resolve_class
    from liger_registry.testing import tiny_config, tiny_model

    registry = single_family_registry(entry)
    model_type = entry.model_types[0]
    try:
        config = tiny_config(model_type, registry)
        with torch.device("meta"):
            count = sum(
                p.numel() for p in resolve_class(entry, entry.causal_lm)._from_config(config).parameters()
            )
        if count > MAX_PARAMETERS:
            raise Refused(f"{count / 1e6:.0f}M parameters with small sizes (a tower the sizes miss)")
        return tiny_model(model_type, registry=registry)
    except Refused as exc:
        raise Refused(f"cannot build a tiny model: {exc}") from exc
    except ImportError as exc:
        raise Refused(f"cannot build a tiny model: {missing_backends(exc)}") from exc
    except Exception as exc:  # any config or constructor error is why this type is refused
        configs = _configs(entry)
        raise refusal("cannot build a tiny model", exc, configs) from exc


_MISSING_BACKEND = re.compile(r"^(\w+) requires the (\S+) library but it was not found", re.M)


def missing_backends(exc: ImportError) -> str:
    """Every package a class of the model needs and the environment lacks (transformers' requires_backends
    names them one per paragraph), not just the first."""
    found = _MISSING_BACKEND.findall(str(exc))
    if not found:
        return f"ImportError: {first_line(exc)}"
    classes = ", ".join(dict.fromkeys(cls for cls, _ in found))
    packages = ", ".join(dict.fromkeys(pkg for _, pkg in found))
    return (
        f"ImportError: {classes} (built with the model, even where the checks never run it) needs {packages}, "
        "not installed here"
    )


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _family_name(model_type: str) -> str:
    name = "".join(c if c.isalnum() else "_" for c in model_type.lower())
    return name if name[:1].isalpha() else f"m_{name}"


def _leaf_norms(model: nn.Module) -> dict[str, Captured]:
    found = module_classes(model, lambda cls: "Norm" in cls.__name__)
    return {n: c for n, c in found.items() if not list(c.instances[0].children())}


def _gated_mlps(model: nn.Module) -> dict[str, Captured]:
    found = module_classes(model, lambda cls: not cls.__name__.endswith(("Model", "ForCausalLM", "Layer")))
    return {n: c for n, c in found.items() if decide.is_gated_mlp_candidate(c.cls, c.instances[0])}


def _structure_notes(model: nn.Module, mlps: dict[str, Captured]) -> list[str]:
    notes = []
    for name, captured in module_classes(model, lambda cls: True).items():
        module = captured.instances[0]
        if decide.is_experts_candidate(captured.cls):
            notes.append(f"the routed experts are one fused {name} module (3-D weights): see moe_experts")
        elif "Expert" in name and any(p.dim() == 3 for p in module.parameters(recurse=False)):
            notes.append(f"the routed experts are one fused {name} module (3-D weights): no GLU target")
        elif "Expert" in name and any(p.dim() == 2 for p in module.parameters(recurse=False)):
            notes.append(
                f"the routed experts are one fused {name} module (every expert's weights in one 2-D parameter, "
                "not gate/up/down linears): no GLU target"
            )
        elif name.endswith("MLP") and name not in mlps:
            notes.append(f"{name} is not a gated MLP (no gate and up projections): no GLU kernel")
    norms = {type(m).__name__ for m in model.modules() if type(m) in (nn.LayerNorm, nn.RMSNorm)}
    if norms:
        notes.append(
            f"some norms are torch.nn.{'/'.join(sorted(norms))}, which is torch's class and is not patched"
        )
    return notes


def _moe_blocks(model: nn.Module, candidate) -> dict[str, Captured]:
    found = module_classes(model, lambda cls: "Moe" in cls.__name__ or "MoE" in cls.__name__)
    return {n: c for n, c in found.items() if candidate(c.cls, c.instances[0])}


def _described_experts(model: nn.Module) -> dict[str, Captured]:
    found = module_classes(model, lambda cls: "Expert" in cls.__name__)
    return {n: c for n, c in found.items() if decide.is_described_experts_candidate(c.cls, c.instances[0])}


def _activations(model: nn.Module) -> dict[str, Captured]:
    return module_classes(model, decide.is_relu_squared_candidate)


def _clamped_gates(model: nn.Module) -> dict[str, Captured]:
    found = module_classes(model, lambda cls: callable(getattr(cls, "_apply_gate", None)))
    return {n: c for n, c in found.items() if decide.is_clamped_gate_candidate(c.cls, c.instances[0])}


def norm_and_mlp_verdicts(
    model: nn.Module, config: Any, run, source: ModelSource
) -> tuple[list[decide.Verdict], list[str]]:
    norms, mlps, activations = _leaf_norms(model), _gated_mlps(model), _activations(model)
    experts = module_classes(model, decide.is_experts_candidate)
    blocks = _moe_blocks(model, decide.is_input_scaled_block_candidate)
    softmax_blocks = _moe_blocks(model, decide.is_softmax_top_k_block_candidate)
    described = _described_experts(model)
    found = {**norms, **mlps, **activations, **experts, **blocks, **softmax_blocks, **described}
    for captured in found.values():
        captured.target = target_name(captured.cls, source.module)
    capture_inputs(model, found, run)
    verdicts = []
    for captured in norms.values():
        has_bias = isinstance(getattr(captured.instances[0], "bias", None), nn.Parameter)
        verdict = (decide.decide_layer_norm if has_bias else decide.decide_rms_norm)(captured)
        if not has_bias and verdict.reason and "a LayerNorm" in verdict.reason:
            verdict = decide.decide_layer_norm(
                captured
            )  # filed, and explained, under the kernel it resembles
        verdicts.append(verdict)
    verdicts += [decide.decide_glu(captured, config) for captured in mlps.values()]
    verdicts += [v for c in activations.values() if (v := decide.decide_relu_squared(c)) is not None]
    verdicts += [decide.decide_moe_experts(captured, config) for captured in experts.values()]
    verdicts += [decide.decide_input_scaled_block(captured, config) for captured in blocks.values()]
    verdicts += [decide.decide_softmax_top_k_block(captured, config) for captured in softmax_blocks.values()]
    verdicts += [decide.decide_described_experts(captured, config) for captured in described.values()]
    for captured in _clamped_gates(model).values():
        captured.target = target_name(captured.cls, source.module)
        verdicts.append(decide.decide_clamped_gate(captured))
    return verdicts, _structure_notes(model, mlps)


def rope_verdict(source: ModelSource, run, run_low=None) -> decide.Verdict:
    """The module's rotary functions that a forward pass calls (apply_rotary_pos_emb first), each replayed
    through the rope layouts' drop-ins: the first one a layout reproduces, else why none is served. ``run_low``
    runs the model in bf16: its calls carry the dtypes a bf16 model really passes (a family may keep cos/sin in
    fp32 and cast the results back)."""
    name = "apply_rotary_pos_emb"
    others = [f for f in rotary_functions(source.module) if f != name]
    elsewhere = f" (the module has {', '.join(others)})" if others else ""
    present = [f for f in (name, *others) if callable(getattr(source.module, f, None))]
    verdicts = [
        decide.decide_rope(
            f,
            getattr(source.module, f),
            record_calls(source.module, f, run),
            None if run_low is None else record_calls(source.module, f, run_low),
        )
        for f in present
    ]
    if ok := next((v for v in verdicts if v.ok), None):
        return ok
    called = [v for v in verdicts if "is not called" not in v.reason]
    if called:
        return called[0]
    if name not in present:
        return decide.Verdict("rope", name, reason=f"the module has no {name} to replace{elsewhere}")
    return decide.Verdict(
        "rope",
        name,
        reason=f"{name} is not called in a forward pass: the attention rotates q and k by "
        f"other code{elsewhere}",
    )


def _section(verdicts: list[decide.Verdict], kernel: str, notes: list[str]) -> dict[str, Any] | None:
    """One kernel's YAML section: the largest group of targets computing one formula, or off with the reasons."""
    ok = [v for v in verdicts if v.kernel == kernel and v.ok]
    bad = [v for v in verdicts if v.kernel == kernel and not v.ok]
    groups: dict[tuple, list[decide.Verdict]] = {}
    for verdict in ok:
        groups.setdefault(tuple(sorted(verdict.spec.items())), []).append(verdict)
    if groups:
        chosen = max(groups.values(), key=len)
        notes += [
            f"{v.target} computes {kernel} with other options ({v.spec}); left as it is"
            for v in ok
            if v not in chosen
        ]
        notes += [f"{v.reason}; left as it is" for v in bad]
        return {"targets": [v.target for v in chosen], **chosen[0].spec}
    if not bad:
        return None
    return {"targets": [v.target for v in bad], "enabled": False, "reason": "; ".join(v.reason for v in bad)}


def _kernels(verdicts: list[decide.Verdict], rope: decide.Verdict, notes: list[str]) -> dict[str, Any]:
    kernels = {}
    glu_failures = [v for v in verdicts if v.kernel == "swiglu" and not v.ok]
    if any(v.ok and v.kernel == "geglu" for v in verdicts) and not any(
        v.ok and v.kernel == "swiglu" for v in verdicts
    ):
        for verdict in glu_failures:
            verdict.kernel = "geglu"  # report an unfit MLP under the kernel its siblings get
    for kernel in (
        "moe_experts",
        "rms_norm",
        "layer_norm",
        "swiglu",
        "geglu",
        "relu_squared",
        "swiglu_clamped",
    ):
        if (section := _section(verdicts, kernel, notes)) is not None:
            kernels[kernel] = section
    if rope.ok:
        kernels["rope"] = rope.spec
    else:
        kernels["rope"] = {**rope.spec, "enabled": False, "reason": rope.reason}
    return kernels


NORM_OPTIONS = ("casting_mode", "offset", "eps_attr", "weight_attr")


def add_rms_norm_section(model: nn.Module, source: ModelSource, rms: dict[str, Any] | None) -> dict | None:
    """The fused residual add + post-attention norm on the module's decoder layers whose forward is llama-shaped
    (:mod:`liger_registry.modules.layer_shape`) and whose post-attention norm is one of the drafted rms_norm
    targets (same options); None when no layer is."""
    from liger_registry.modules.layer_shape import LayerShape, layer_shape

    if not rms or rms.get("enabled") is False:
        return None
    targets = set()
    for layer in model.modules():
        cls = type(layer)
        if cls.__module__ != source.module.__name__ or not cls.__name__.endswith("DecoderLayer"):
            continue
        shape = layer_shape(cls)
        norm = getattr(layer, shape.post_norm, None) if isinstance(shape, LayerShape) else None
        if norm is not None and target_name(type(norm), source.module) in rms["targets"]:
            targets.add(target_name(cls, source.module))
    if not targets:
        return None
    return {"targets": sorted(targets), **{k: rms[k] for k in NORM_OPTIONS if k in rms}}


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def with_settings(config: PretrainedConfig, tiny: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The tiny config with the user's values over the scaffold's: a plain name goes to the language config
    (where the text model's values are), a dotted one (vision_config.depth) to that nested config."""
    text_attr, text = _text_attr(config), config.get_text_config()
    for name, value in settings.items():
        head, _, rest = name.partition(".")
        if rest:
            where, target = config, {head: _nested(rest, value)}
        elif text_attr is not None and name in text.to_dict():
            where, target = text, {text_attr: {name: value}}
        else:
            where, target = config, {name: value}
        if head not in where.to_dict():
            close = difflib.get_close_matches(head, list(where.to_dict()), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise Refused(f"--set {name}: the {config.model_type} config has no field {head!r}{hint}")
        tiny = merged(tiny, target)
    return tiny


def _nested(path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    return {head: _nested(rest, value) if rest else value}


def draft(model_type: str, family: str | None = None, settings: dict[str, Any] | None = None) -> Draft:
    """Inspect the installed transformers code of `model_type` and draft its entry; Refused with the reason.
    `settings`: config values over the scaffold's (fields the default config leaves unset, see MissingConfig)."""
    from liger_registry.scaffold.head import HeadRefused, decide_head
    from liger_registry.testing import tiny_batch

    try:
        source = model_source(model_type)
        config = AutoConfig.for_model(model_type)
    except Exception as exc:
        raise Refused(f"no config or causal-LM class: {type(exc).__name__}: {first_line(exc)}") from exc
    if config.model_type != model_type:
        raise Refused(
            f"its config reports model_type {config.model_type!r}: an entry for that type serves it"
        )
    try:
        sources = [pyinspect.getsource(source.module), pyinspect.getsource(pyinspect.getmodule(type(config)))]
        tiny, candidates = tiny_overrides(config, "\n".join(sources))
        text_attr = _text_attr(config)
    except Exception as exc:  # e.g. a heterogeneous config that has no global value to read
        raise Refused(f"cannot make the config tiny: {type(exc).__name__}: {first_line(exc)}") from exc
    tiny = with_settings(config, tiny, settings or {})
    model = build_tiny(_base_entry(source, _family_name(family or model_type), tiny, "causal_lm"))
    batch = tiny_batch(model)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    model.eval()

    def run() -> Any:
        return model(**inputs)

    def run_low() -> Any:
        low = copy.deepcopy(model).to(torch.bfloat16)
        return low(**inputs)

    try:
        verdicts, notes = norm_and_mlp_verdicts(model, model.config.get_text_config(), run, source)
        rope = rope_verdict(source, run, run_low)
        head = decide_head(model, source, text_attr, candidates, inputs)
    except HeadRefused as exc:
        raise Refused(str(exc)) from exc
    except Refused:
        raise
    except Exception as exc:  # the tiny model's own forward failing is a reason to refuse, not a crash
        configs = [model.config, model.config.get_text_config()]
        raise refusal("the tiny model's forward raised", exc, configs, sep=" ") from exc
    kernels = _kernels(verdicts, rope, notes)
    if (fused := add_rms_norm_section(model, source, kernels.get("rms_norm"))) is not None:
        kernels["add_rms_norm"] = fused
    entry = FamilyEntry(
        family=_family_name(family or model_type),
        model_types=[model_type],
        module=source.module_name,
        causal_lm=source.causal_lm.__name__,
        forward=head.forward,
        kernels=kernels,
        head=head.head,
        reason="; ".join(dict.fromkeys(notes)) or None,
        tiny_config=tiny,
    )
    return Draft(entry, notes)


class _EntryDumper(yaml.SafeDumper):
    """Block mappings, flow lists of scalars ([LlamaRMSNorm]), as the hand-written family files are."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(v, (dict, list)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_EntryDumper.add_representer(list, _represent_list)


def entry_yaml(entry: FamilyEntry) -> str:
    """The entry as YAML, minus every value the schema would default to."""
    data = entry.model_dump(exclude_defaults=True)
    data.setdefault("kernels", {})
    return yaml.dump(data, Dumper=_EntryDumper, sort_keys=False, width=110, default_flow_style=False)
