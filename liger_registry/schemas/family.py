"""Schema of one model family entry (`registry/families/<family>.yaml`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, Field, StrictBool, create_model, field_validator, model_validator

from liger_registry.attr_path import checked_path
from liger_registry.limits import LAYERED_OPTIONS, ChunkConst, budget_knob
from liger_registry.schemas.base import StrictModel
from liger_registry.schemas.defaults import default, default_list
from liger_registry.schemas.kernel_kinds import KernelsSpec
from liger_registry.schemas.kernels import CrossEntropySpec
from liger_registry.schemas.tiny_config import tiny_config_problems

SkipLogitsMode = Literal["auto", "labels", "never"]
# An attribute name, or a dotted path into a nested config (DBRX's ffn_config.moe_num_experts).
AttrPath = Annotated[str, AfterValidator(checked_path)]


def one_budget(data: Any) -> Any:
    """The one-budget-knob rule on a section: max_chunk_mib set means chunk_mem_const is not (a default's)."""
    if isinstance(data, dict) and budget_knob(data.get("chunk_mem_const"), data.get("max_chunk_mib")) == (
        "max_chunk_mib"
    ):
        return {**data, "chunk_mem_const": None}
    return data


def flce_fields(patch: bool) -> dict[str, Any]:
    """The fields of the FLCE options the registry layers: a family's (defaults from registry/defaults.yaml) or,
    ``patch``, a policy's (every field optional, None: unset)."""
    fields: dict[str, Any] = {}
    for o in LAYERED_OPTIONS:
        annotation = o.schema | None if (o.nullable or patch) else o.schema
        value = None if patch else default(f"flce.{o.name}", o.default)
        fields[o.name] = (annotation, Field(value, description=o.description))
    return fields


def _one_budget(cls: type, data: Any) -> Any:
    return one_budget(data)


ONE_BUDGET = {"_one_budget": model_validator(mode="before")(_one_budget)}

# \Z, not $: "$" also matches before a trailing newline, which a `|` block scalar ends with
_IDENT = re.compile(r"^[a-z][a-z0-9_]*\Z")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?\Z")
_MODULE = re.compile(r"^transformers(\.[A-Za-z_]\w*)+\Z")


FlceSpec = create_model(
    "FlceSpec",
    __base__=StrictModel,
    __doc__="Fused linear cross entropy on the language-model head.",
    __validators__=ONE_BUDGET,
    enabled=(
        StrictBool,
        Field(default("flce.enabled"), description="Compute the training loss without materialising logits."),
    ),
    **flce_fields(patch=False),
    reason=(str | None, Field(None, description="Why the knob has this value for this family.")),
)


class JsdSpec(StrictModel):
    """Fused linear JSD / KL for distillation; its knobs are independent of FLCE's."""

    chunk_mem_const: ChunkConst = Field(
        default("fused_linear_jsd.chunk_mem_const"),
        description="Chunk constant of the distillation loss.",
    )


class MoeSpec(StrictModel):
    """The MoE contract: names the MoE forward reads, checked against the installed transformers by the lint."""

    aux_loss_function: str = Field(
        default("head.moe.aux_loss_function"),
        description="Load-balancing loss function in the family's module.",
    )
    num_experts_attrs: list[AttrPath] = Field(
        default_factory=default_list("head.moe.num_experts_attrs"),
        min_length=1,
        description="Attributes holding the expert count, the first one present wins (model, then config); "
        "each a name or a dotted path into a nested config (ffn_config.moe_num_experts).",
    )
    top_k_attr: AttrPath = Field(
        default("head.moe.top_k_attr"), description="Attribute (or dotted path) holding experts per token."
    )
    coefficient_attr: AttrPath = Field(
        default("head.moe.coefficient_attr"),
        description="Attribute (or dotted path) holding the aux-loss coefficient.",
    )

    def attrs(self) -> dict[str, list[str]]:
        """What each constant is read from, in order."""
        return {
            "num_experts": list(self.num_experts_attrs),
            "top_k": [self.top_k_attr],
            "coefficient": [self.coefficient_attr],
        }


HEAD_CONFIG_ATTRS = ("softcap_attr", "logit_scale_attr", "logit_multiplier_attr")


class HeadSpec(StrictModel):
    """Where the head is and how its logits are post-processed."""

    lm_head: str = Field(
        default("head.lm_head"), description="Attribute of the causal LM holding the output projection."
    )
    base_model: str = Field(
        default("head.base_model"), description="Attribute of the causal LM holding the decoder."
    )
    softcap_attr: str | None = Field(None, description="Config attribute of final-logit softcapping, if any.")
    logit_scale_attr: str | None = Field(
        None, description="Config attribute the logits are divided by (granite's logits_scaling), if any."
    )
    logit_multiplier_attr: str | None = Field(
        None,
        description="Config attribute the logits are multiplied by (falcon_h1's lm_head_multiplier), if any.",
    )
    optional_attrs: list[str] = Field(
        default_factory=list,
        description="Config attributes named above that may be absent from the language config (a multimodal "
        "family whose text model varies); any other named attribute must exist, checked at apply and by lint.",
    )
    text_config_attr: str | None = Field(
        None, description="Config attribute holding the language model's config (multimodal families)."
    )
    moe: MoeSpec = Field(default_factory=MoeSpec, description="What the MoE forward reads from transformers.")

    @model_validator(mode="after")
    def _optional_named(self) -> HeadSpec:
        named = {getattr(self, key) for key in HEAD_CONFIG_ATTRS}
        if stray := [a for a in self.optional_attrs if a not in named]:
            raise ValueError(
                f"optional_attrs {stray} are not named by {', '.join(HEAD_CONFIG_ATTRS)} (nothing to make optional)"
            )
        return self


class FamilyEntry(StrictModel):
    """One model family: which forward to install and which kernels go where."""

    family: str = Field(..., description="Family name; policies name families by it.")
    model_types: list[str] = Field(
        ..., min_length=1, description="config.model_type values this entry serves."
    )
    module: str = Field(..., description="The transformers modeling module of the family.")
    causal_lm: str = Field(..., description="Class in `module` whose forward is replaced.")
    forward: str = Field(
        default("forward"), description="Name of a registered forward (never a dotted path)."
    )
    transformers: str = Field(
        default("transformers"),
        description="PEP 440 specifier of supported transformers versions; it narrows the defaults' range "
        "(a family for a type only newer releases have states a lower bound), never widens it.",
    )
    tested: list[str] = Field(
        default_factory=default_list("tested"), description="transformers versions the parity suite ran on."
    )
    kernels: KernelsSpec = Field(default_factory=KernelsSpec, description="Kernels and their targets.")
    flce: FlceSpec = Field(default_factory=FlceSpec, description="Fused linear cross entropy knobs.")
    cross_entropy: CrossEntropySpec = Field(
        default_factory=CrossEntropySpec,
        description="Cross entropy of the materialised logits by our kernel (every causal-LM head; off by default).",
    )
    fused_linear_jsd: JsdSpec = Field(default_factory=JsdSpec, description="Distillation loss knobs.")
    head: HeadSpec | None = Field(
        default_factory=HeadSpec,
        description="Head layout and logit post-processing; null: the class has no causal-LM head (a bare "
        "language model inside a multimodal one), so no forward is installed, only the kernels.",
    )
    skip_logits: SkipLogitsMode = Field(
        default("skip_logits"),
        description="auto: skip in training with labels; labels: whenever labels; never: always logits.",
    )
    reason: str | None = Field(None, description="Notes on the family printed by show and explain.")
    known_broken: dict[str, str] = Field(
        default_factory=dict,
        description="transformers versions ('5.24', or '5.24.1') on which the family's own unpatched forward is "
        "broken, each with why; explain, lint --deep and the parity tests read it.",
    )
    tiny_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Config values (over liger_registry.testing's small defaults) of the tiny model that "
        "`lint --deep` and the parity suite build for this family: plain config fields only (no private "
        "`_` keys, auto_map, trust_remote_code or *_implementation: never remote code).",
    )

    @field_validator("family")
    @classmethod
    def _family_name(cls, value: str) -> str:
        if not _IDENT.match(value):
            raise ValueError("family must be lower-case letters, digits and underscores")
        return value

    @field_validator("module")
    @classmethod
    def _module_under_transformers(cls, value: str) -> str:
        if not _MODULE.match(value):
            raise ValueError("module must be a dotted path under 'transformers.' (no other code is imported)")
        return value

    @field_validator("transformers")
    @classmethod
    def _specifier(cls, value: str) -> str:
        try:
            SpecifierSet(value)
        except InvalidSpecifier as exc:
            raise ValueError(f"not a PEP 440 version specifier: {value!r}") from exc
        return value

    @field_validator("known_broken")
    @classmethod
    def _versions(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [v for v in value if not _VERSION.match(v)]
        if bad:
            raise ValueError(f"keys must be release numbers such as '5.24' or '5.24.1', got {bad}")
        return value

    @field_validator("tiny_config")
    @classmethod
    def _plain_config(cls, value: dict[str, Any]) -> dict[str, Any]:
        if problems := tiny_config_problems(value):
            raise ValueError("; ".join(problems))
        return value

    def broken_on(self, version: str) -> str | None:
        """Why the family is known broken on this transformers version ('5.24.0' matches '5.24'), or None."""
        for key, why in self.known_broken.items():
            if version == key or version.startswith(key + "."):
                return f"transformers {key} is known broken for family {self.family!r}: {why}"
        return None


KNOB_SECTIONS = ("kernels", "flce", "cross_entropy", "fused_linear_jsd", "skip_logits")
