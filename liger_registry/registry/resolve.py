"""Layers defaults, the family entry, policies and keyword overrides into one configuration with provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from liger_registry.limits import BUDGET_KNOBS, budget_knob
from liger_registry.registry.errors import RegistryError, suggest
from liger_registry.registry.family_switches import lacks, switch_off_note, switch_on_problem
from liger_registry.registry.loader import (
    LoadedFamily,
    LoadedPolicy,
    Registry,
    applies_to_problems,
    load_policy,
)
from liger_registry.schemas import OVERRIDE_PATHS, FamilyEntry, Overrides
from liger_registry.schemas.family import KNOB_SECTIONS
from liger_registry.schemas.overrides import SWITCHES


class Layer(IntEnum):
    """The layers of a family's configuration, lowest first: a higher one wins."""

    DEFAULT = 1
    FAMILY = 2
    REGISTRY_POLICY = 3
    USER_POLICY = 4
    OVERRIDE = 5

    def __str__(self) -> str:
        return _LAYER_NAMES[self]


_LAYER_NAMES = {
    Layer.DEFAULT: "default (registry/defaults.yaml)",
    Layer.FAMILY: "family",
    Layer.REGISTRY_POLICY: "registry policy",
    Layer.USER_POLICY: "user policy",
    Layer.OVERRIDE: "override",
}


@dataclass(frozen=True)
class Source:
    """Which layer set a knob; a policy's also says where the policy came from."""

    layer: Layer
    name: str
    path: Path | None = None
    origin: str | None = (
        None  # of a registry policy: bundled | plugin <name> | LIGER_REGISTRY_PATH | directory
    )

    def __str__(self) -> str:
        where = f" ({self.path.name})" if self.path else ""
        layer = (
            f"{self.origin} policy"
            if self.layer is Layer.REGISTRY_POLICY and self.origin
            else str(self.layer)
        )
        return f"{layer} {self.name}{where}".strip()


@dataclass
class ResolvedConfig:
    """A family's configuration after layering: the typed entry and where each knob came from."""

    family: str
    entry: FamilyEntry
    path: Path
    provenance: dict[str, Source] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    policies: list[str] = field(default_factory=list)
    policy_files: dict[str, str] = field(
        default_factory=dict
    )  # applied policy -> where it came from, its file
    noops: dict[str, str] = field(
        default_factory=dict
    )  # switch the family lacks, turned off -> the report line
    not_applied: dict[str, str] = field(
        default_factory=dict
    )  # registry policy the family does not get -> why (explain and the report list them)

    def source(self, knob: str) -> Source:
        return self.provenance[knob]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


BUDGET = tuple(f"flce.{knob}" for knob in BUDGET_KNOBS)


def _budget(values: dict, provenance: dict, updates: dict[str, Any], source: Source) -> list[str]:
    """The one-budget-knob rule: a layer that sets chunk_mem_const or max_chunk_mib clears the other."""
    try:
        setting = budget_knob(*(updates.get(knob) for knob in BUDGET))
    except ValueError:
        return [f"{source}: sets both {' and '.join(BUDGET)}: they are one budget knob, set one"]
    for other in (k for k in BUDGET if setting and k != f"flce.{setting}"):
        values[other], provenance[other] = None, source
    return []


def _layer(
    values: dict, provenance: dict, updates: dict[str, Any], source: Source, entry: FamilyEntry, noops: dict
) -> list[str]:
    """One layer's updates; switching off what the family lacks is a no-op noted in `noops`, switching it on (or
    setting any other knob of it) is a problem naming what the family has."""
    problems = _budget(values, provenance, updates, source)
    for knob, value in updates.items():
        switch = SWITCHES.get(knob)
        if switch is not None and lacks(entry, switch):
            if value is False:
                noops[switch] = switch_off_note(entry, switch, source)
            else:
                problems.append(f"{source}: {switch_on_problem(entry, switch)}")
        elif knob not in values:
            kernel = knob.split(".")[1] if knob.startswith("kernels.") else knob
            if updates.get(f"kernels.{kernel}.enabled") is not False:  # else a reason of a no-op
                problems.append(f"{source}: sets {knob!r}, but {switch_on_problem(entry, kernel)}")
        else:
            values[knob], provenance[knob] = value, source
    return problems


def validate_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = [k for k in overrides if k not in OVERRIDE_PATHS]
    if unknown:
        raise RegistryError(
            "unknown keyword override(s)",
            [f"{k!r}{suggest(k, OVERRIDE_PATHS)}; allowed: {', '.join(OVERRIDE_PATHS)}" for k in unknown],
        )
    try:
        checked = Overrides.model_validate(overrides)
    except ValidationError as exc:
        raise RegistryError(
            "invalid keyword override(s)",
            [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()],
        ) from None
    return {OVERRIDE_PATHS[k]: v for k, v in checked.model_dump(exclude_none=True).items()}


def _policy_updates(policy: LoadedPolicy) -> dict[str, Any]:
    return flatten(policy.policy.model_dump(include=set(KNOB_SECTIONS), exclude_none=True))


def resolve(
    registry: Registry,
    loaded: LoadedFamily,
    policy: str | Path | list | None = None,
    overrides: dict[str, Any] | None = None,
) -> ResolvedConfig:
    """Layers 1-5 of DESIGN.md; every problem is reported at once and nothing is half-resolved."""
    entry = loaded.entry
    values = flatten(entry.model_dump(include=set(KNOB_SECTIONS)))
    explicit = flatten(entry.model_dump(include=set(KNOB_SECTIONS), exclude_unset=True))
    family_source = Source(Layer.FAMILY, entry.family, loaded.path)
    provenance = {k: family_source if k in explicit else Source(Layer.DEFAULT, "") for k in values}
    applied, problems, files, noops = [], [], {}, {}
    for bundled in registry.policies_for(entry.family):
        problems += _layer(
            values,
            provenance,
            _policy_updates(bundled),
            Source(Layer.REGISTRY_POLICY, bundled.policy.policy, bundled.path, bundled.origin),
            entry,
            noops,
        )
        applied.append(bundled.policy.policy)
        files[bundled.policy.policy] = f"{bundled.origin}: {bundled.path}"
    for user in _user_policies(registry, policy):
        if not user.policy.applies(entry.family):
            # asked for by name or file: dropping it would leave the caller believing it is in force
            problems.append(
                f"policy {user.policy.policy!r} ({user.origin}: {user.path}) applies to "
                f"{', '.join(user.policy.applies_to)}, not to family {entry.family!r}"
            )
            continue
        problems += _layer(
            values,
            provenance,
            _policy_updates(user),
            Source(Layer.USER_POLICY, user.policy.policy, user.path),
            entry,
            noops,
        )
        applied.append(user.policy.policy)
        files[user.policy.policy] = f"{user.origin}: {user.path}"
    overrides = validate_overrides(overrides or {})
    problems += _layer(values, provenance, overrides, Source(Layer.OVERRIDE, ""), entry, noops)
    if problems:
        raise RegistryError(f"cannot resolve family {entry.family!r}", problems)
    merged = {**entry.model_dump(exclude=set(KNOB_SECTIONS)), **unflatten(values)}
    resolved = FamilyEntry.model_validate(merged)
    not_applied = _not_applied(registry, entry.family, applied)
    return ResolvedConfig(
        entry.family, resolved, loaded.path, provenance, values, applied, files, noops, not_applied
    )


def _not_applied(registry: Registry, family: str, applied: list[str]) -> dict[str, str]:
    """The registry's policies this family does not get, each with why (another family's, or opt-in)."""
    out = {}
    for loaded in registry.policies:
        policy = loaded.policy
        if policy.policy in applied:
            continue
        if not policy.applies(family):
            out[policy.policy] = f"applies to {', '.join(policy.applies_to)}"
        else:
            out[policy.policy] = f"opt-in: policy={policy.policy!r} applies it"
    return out


def not_applied_line(config: ResolvedConfig) -> str | None:
    """The line of explain and of the apply report that lists the registry policies left out, or None."""
    if not config.not_applied:
        return None
    return "policies not applied: " + ", ".join(f"{p} ({why})" for p, why in config.not_applied.items())


def _user_policies(registry: Registry, policy: str | Path | list | None) -> list[LoadedPolicy]:
    """Policies the caller asked for: files, or registry policies by name (e.g. the opt-in 'throughput')."""
    if policy is None:
        return []
    items = policy if isinstance(policy, (list, tuple)) else [policy]
    loaded = [_user_policy(registry, p) for p in items]
    if problems := [p for user in loaded for p in applies_to_problems(user.policy, user.path, registry)]:
        raise RegistryError("policy names what the registry does not have", problems)
    return loaded


def _user_policy(registry: Registry, policy: str | Path | LoadedPolicy) -> LoadedPolicy:
    if isinstance(policy, LoadedPolicy):
        return policy
    if not isinstance(policy, (str, Path)):
        raise RegistryError(
            f"policy must be a bundled policy name, a YAML file path or a list of them; got "
            f"{type(policy).__name__} {str(policy)[:80]!r}"
        )
    named = registry.named_policy(policy) if isinstance(policy, str) else None
    if named is not None and not Path(policy).is_file():
        return named
    if isinstance(policy, str) and not Path(policy).suffix and not Path(policy).exists():
        names = sorted(p.policy.policy for p in registry.policies)
        raise RegistryError(
            f"no policy file or registry policy named {policy!r}{suggest(policy, names)}; named: {', '.join(names)}"
        )
    return load_policy(policy)
