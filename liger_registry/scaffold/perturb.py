"""The perturbation check: each config value an entry reads (and each knob its tiny config sets) is changed, and
the patched model must move exactly as the unpatched one does. A parity run on one config cannot tell two
attributes of equal value apart (a head reading the attention softcap where the model reads the final one);
a change to one of them can."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig

from liger_registry.attr_path import read_path
from liger_registry.registry.applier import patched
from liger_registry.registry.loader import Registry
from liger_registry.scaffold.draft import first_line, merged, single_family_registry
from liger_registry.schemas import FamilyEntry
from liger_registry.schemas.family import HEAD_CONFIG_ATTRS

TOLERANCE = 1e-5  # fp32: |patched - unpatched| / (1 + |unpatched|), of the loss
# A patched model that did not follow a change of the unpatched loss differs from it by that change: one larger
# than the tolerance (with a margin) shows. An attribute the entry names must move the loss this much to be
# pinned down.
MOVED = 3 * TOLERANCE
# Tried in turn until the unpatched loss moves: the strongest change first (a softcap or a multiplier a tenth
# bends tiny-model logits far more than twice; an epsilon ten times larger is the one that shows); a softcap a
# hundredth bends even the small logits of a tiny model.
FLOAT_FACTORS = (0.1, 10.0, 0.01)
EPS_FACTORS = (10.0, 0.1)
# A fraction (partial_rotary_factor) stays one: a tenth of a tiny head's rotary width is no rotation at all.
_FRACTION = re.compile(r"factor|ratio")
INT_STEPS = (1, -1)


@dataclass
class Perturbation:
    """The loss of one changed config, unpatched and patched (None where the model did not run)."""

    attr: str
    value: Any
    want: float | None = None
    got: float | None = None
    error: str | None = None


@dataclass
class PerturbationCheck:
    """Every attribute changed: `named` are those the entry reads (each must move the loss), `others` the knobs
    the tiny config sets (each, where it moves the loss, must move the patched one alike)."""

    base: tuple[float, float] | None = None  # (unpatched, patched) losses of the unchanged config
    named: list[str] = field(default_factory=list)
    tried: list[Perturbation] = field(default_factory=list)
    unpinned: dict[str, str] = field(default_factory=dict)  # attribute -> why it is not pinned down

    @property
    def ok(self) -> bool:
        return self.base is not None and not self.unpinned

    def problems(self) -> list[str]:
        return [f"could not pin down {attr}: {why}" for attr, why in self.unpinned.items()]

    def summary(self) -> str:
        pinned = [a for a in self.named if a not in self.unpinned]
        others = {p.attr for p in self.tried} - set(self.named)
        return (
            f"{len(pinned)} attribute(s) the entry reads pinned ({', '.join(pinned) or 'none'}), "
            f"{len(others)} other knob(s) followed"
        )


def named_attrs(entry: FamilyEntry, config: PretrainedConfig) -> list[str]:
    """The config attributes (paths in the language config) the entry's forward reads: the head's logit
    post-processing and, for the MoE forward, the router loss's expert count, top-k and coefficient."""
    head = entry.head
    if head is None:
        return []
    names = [getattr(head, key) for key in HEAD_CONFIG_ATTRS if getattr(head, key)]
    if entry.forward == "causal_lm_moe":
        for paths in head.moe.attrs().values():
            # the first present wins, as the forward reads them
            names += [p for p in paths if read_path(config, p) is not None][:1]
    return list(dict.fromkeys(names))


def knob_attrs(tiny: dict[str, Any], prefix: str = "") -> list[str]:
    """Paths of the float values of a tiny config (the knobs the scaffold set: softcaps, scales, multipliers,
    epsilons, rope parameters), nested mappings included."""
    found = []
    for name, value in tiny.items():
        if isinstance(value, float) and value and "drop" not in name:  # dropout stays off: runs compare
            found.append(prefix + name)
        elif isinstance(value, dict):
            found += knob_attrs(value, f"{prefix}{name}.")
    return found


def override(config: Any, path: str, value: Any) -> dict[str, Any]:
    """A tiny_config fragment that sets `path` of `config` to `value`: a nested config becomes a nested
    mapping (merged by the loader), a plain mapping (rope_parameters) is given whole with the one key changed."""
    head, _, rest = path.partition(".")
    if not rest:
        return {head: value}
    current = getattr(config, head, None) if not isinstance(config, dict) else config.get(head)
    if isinstance(current, PretrainedConfig):
        return {head: override(current, rest, value)}
    if isinstance(current, dict):
        return {head: {**current, **override(current, rest, value)}}
    return {head: value} if not rest else {head: override({}, rest, value)}


def read(config: Any, path: str) -> Any:
    """`path` of a config, through nested configs and plain mappings (rope_parameters.rope_theta)."""
    for name in path.split("."):
        config = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return config


def changed_values(attr: str, value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [v for v in (value + s for s in INT_STEPS) if v >= 1]
    if not isinstance(value, float):
        return []
    name = attr.rsplit(".", 1)[-1]
    if _FRACTION.search(name) and 0 < value <= 1:
        return [value / 2] + ([1.0] if value < 1 else [])
    factors = EPS_FACTORS if "eps" in name else FLOAT_FACTORS
    return [float(f"{value * f:.6g}") for f in factors] if value else [0.5, 2.0]


def _loss(model, batch: dict, moe: bool) -> float:
    model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        out = model(**batch, **({"output_router_logits": True} if moe else {}))
    return float(out.loss)


def _losses(entry: FamilyEntry, base: Registry | None, tiny: dict[str, Any]) -> tuple[float, float | str]:
    """(unpatched, patched) training losses of the entry's tiny model built from `tiny`; the patched one is the
    error's text where the patched model raised (the unpatched one's error propagates)."""
    from liger_registry.testing import tiny_batch, tiny_model

    changed = entry.model_copy(update={"tiny_config": tiny})
    registry = single_family_registry(changed, base)
    reference = tiny_model(entry.model_types[0], registry=registry)
    candidate = copy.deepcopy(reference)
    batch = tiny_batch(reference)
    moe = entry.forward == "causal_lm_moe"
    want = _loss(reference, batch, moe)  # before apply: rope is patched module-wide
    try:
        with patched(candidate, registry=registry):
            got: float | str = _loss(candidate, batch, moe)
    except Exception as exc:  # noqa: BLE001 - the patched model failing where the original runs is the finding
        got = f"the patched model raised {type(exc).__name__}: {first_line(exc)}"
    return want, got


def _rel(a: float, b: float) -> float:
    return abs(a - b) / (1 + abs(b))


def _pin(check: PerturbationCheck, entry, base, config, attr: str, named: bool) -> None:
    """Change `attr` until the unpatched loss moves (an attribute the entry reads; another knob gets the first
    value the model runs with); record where the patched loss does not move alike."""

    base_want, base_got = check.base
    current = read(config, attr)
    values, failures = changed_values(attr, current), []
    for value in values:
        tiny = merged(entry.tiny_config, override(config, attr, value))
        try:
            want, got = _losses(entry, base, tiny)
        except Exception as exc:  # noqa: BLE001 - the model does not take this value: try another
            failures.append(f"{value!r}: {type(exc).__name__}: {first_line(exc)[:80]}")
            continue
        check.tried.append(Perturbation(attr, value, want, got if isinstance(got, float) else None))
        if isinstance(got, str):
            check.unpinned[attr] = f"set to {value!r}: {got}"
            return
        if _rel(got, want) > TOLERANCE or _rel(got - base_got, want - base_want) > TOLERANCE:
            check.unpinned[attr] = (
                f"set to {value!r} (from {current!r}), the unpatched loss moves {base_want:.6g} -> {want:.6g} "
                f"but the patched one {base_got:.6g} -> {got:.6g}"
            )
            return
        if _rel(want, base_want) > MOVED or not named:
            return
    if named:
        tried = ", ".join(repr(v) for v in values) or "no value of its type"
        why = f"the model does not run with it changed ({'; '.join(failures)})" if failures else ""
        check.unpinned[attr] = why or (
            f"changing it from {current!r} (to {tried}) does not move the unpatched loss by {MOVED:g}: nothing "
            "shows whether the patched model reads it as the unpatched one does"
        )


def perturbation_check(
    entry: FamilyEntry, base: Registry | None = None, losses: tuple[float, float] | None = None
) -> PerturbationCheck:
    """Each attribute the entry reads and each knob of its tiny config, changed one at a time (see the module).
    `losses`: the (unpatched, patched) losses of the unchanged tiny config, where a parity run has them."""
    from liger_registry.testing import tiny_config

    check = PerturbationCheck()
    config = tiny_config(entry.model_types[0], single_family_registry(entry, base))
    text_attr = entry.head.text_config_attr if entry.head is not None else None
    text = getattr(config, text_attr) if text_attr else config
    prefix = f"{text_attr}." if text_attr else ""
    check.named = [prefix + a for a in named_attrs(entry, text)]
    want, got = losses or _losses(entry, base, entry.tiny_config)
    if isinstance(got, str) or _rel(got, want) > TOLERANCE:
        check.unpinned["(unchanged config)"] = (
            got if isinstance(got, str) else f"losses {got:.6g} vs {want:.6g}"
        )
        return check
    check.base = (want, got)
    for attr in dict.fromkeys(check.named + knob_attrs(entry.tiny_config)):
        _pin(check, entry, base, config, attr, named=attr in check.named)
    return check
