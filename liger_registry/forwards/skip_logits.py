"""Resolves the skip_logits argument of every forward against the family's default mode."""

from __future__ import annotations


def resolve_skip_logits(skip_logits: bool | None, mode: str, training: bool, has_labels: bool) -> bool:
    """Whether to return no logits (and, when the family's FLCE is on, compute the loss without them).

    None follows the mode: `auto` skips in training mode when labels are given, `labels` whenever labels
    are given, `never` always materialises logits. True without labels is an error: there is no loss to compute.
    With FLCE off ("never fuse") the answer means the same to the caller: True gives the loss, computed from
    materialised logits, and no logits; False gives the logits and the loss.
    """
    if skip_logits is None:
        if mode == "auto":
            return training and has_labels
        if mode == "labels":
            return has_labels
        if mode == "never":
            return False
        raise ValueError(f"unknown skip_logits mode {mode!r}; expected auto, labels or never")
    if not isinstance(skip_logits, bool):
        raise TypeError(f"skip_logits must be True, False or None, got {skip_logits!r}")
    if skip_logits and not has_labels:
        raise ValueError(
            "skip_logits=True needs labels or shift_labels: without them there is no loss to compute"
        )
    return skip_logits
