"""Resolves the skip_logits argument of every forward against the family's default mode."""

from __future__ import annotations


def resolve_skip_logits(
    skip_logits: bool | None, mode: str, training: bool, has_labels: bool, *, fuses: bool = True
) -> bool:
    """Whether to return no logits (and, when the loss is fused, compute it without them).

    None follows the mode: `auto` skips in training mode when labels are given and the forward fuses the loss
    (`fuses`: FLCE on and a head it can read); a forward that does not fuse returns the logits it computed, as
    the unpatched model does. `labels` skips whenever labels are given, `never` always materialises logits.
    True without labels is an error: there is no loss to compute. Without fusing, True gives the loss, computed
    from materialised logits, and no logits; False gives the logits and the loss.
    """
    if skip_logits is None:
        if mode == "auto":
            return training and has_labels and fuses
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
