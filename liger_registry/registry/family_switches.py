"""The on/off switches a family has, and the rule for a switch it lacks: off is a no-op, on is an error."""

from __future__ import annotations

from liger_registry.schemas import FamilyEntry
from liger_registry.schemas.kernel_kinds import CE_KEY, FLCE_KEY


def switches(entry: FamilyEntry) -> list[str]:
    """The kernels the family declares, and the head's two losses when it has a causal-LM head."""
    declared = [name for name, spec in entry.kernels if spec is not None]
    return declared + ([FLCE_KEY, CE_KEY] if entry.head is not None else [])


def lacks(entry: FamilyEntry, name: str) -> str | None:
    """Why the family cannot have the switch `name` (None when it has it). The fused loss stays a switch of a
    family without a head (its default is on everywhere; the plan says there is no head to fuse)."""
    if name in switches(entry) or name == FLCE_KEY:
        return None
    if name == CE_KEY:
        return f"family {entry.family!r} has no causal-LM head (head: null), so no {name}"
    return f"family {entry.family!r} has no {name} kernel"


def switch_on_problem(entry: FamilyEntry, name: str) -> str:
    """The error for switching on what the family lacks, naming what it has."""
    return f"{lacks(entry, name)}; its switches: {', '.join(switches(entry)) or 'none'}"


def switch_off_note(entry: FamilyEntry, name: str, source: object) -> str:
    """The report line of switching off what the family lacks (a no-op)."""
    return f"{lacks(entry, name)}: nothing to switch off ({source})"
