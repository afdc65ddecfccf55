"""The label check of the losses: class ids in [0, V) or the ignore value, else a ValueError naming them.

* :func:`check_labels`: one masked ``aminmax`` over the N labels (no pass over the [N, V] logits) and one host
  read of its two results per call, not per chunk; the same message on both backends.
* :func:`start_label_check`: the fused losses on CUDA replace bad ids on the device, queue the loss, then wait
  for the flag and raise before the loss is returned (an early read made the host wait for all earlier GPU
  work, so the loss's launches met an idle GPU).
* Why: the Triton row kernels load ``logits[row, target]`` without a bounds check (a bad id reads another row's
  memory and gives a finite, plausible loss), and the PyTorch path fails deep inside ``gather``. Its cost
  against a loss call: docs/design/ce-label-check.md (the GPU bound is asserted by tests/kernels/test_flce.py, marker gpu).
* Under torch.compile the check runs inside the opaque custom ops (FLCE, Triton cross entropy); the traced
  PyTorch cross entropy skips it (no graph break) and leaves the bounds check to ``gather``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LABEL_DTYPES = (torch.int64, torch.int32)
SHOWN = 8  # bad ids named in the message


def _check_dtype(target: torch.Tensor) -> None:
    if target.dtype not in LABEL_DTYPES:
        raise ValueError(
            f"target must hold class ids as int64 (or int32); got dtype {str(target.dtype).removeprefix('torch.')}"
        )


def check_labels(target: torch.Tensor, ignore_index: int, num_classes: int) -> None:
    """Raise ValueError unless ``target`` holds int64/int32 ids in ``[0, num_classes)`` or ``ignore_index``."""
    _check_dtype(target)
    if target.numel() == 0 or target.is_meta:  # meta tensors have no values to check (shape inference)
        return
    lo, hi = torch.stack(torch.aminmax(target.masked_fill(target == ignore_index, 0))).tolist()
    if lo >= 0 and hi < num_classes:
        return
    _raise_bad(target, ignore_index, num_classes)


def _no_check() -> None:
    return None


def start_label_check(
    target: torch.Tensor, ignore_index: int, num_classes: int
) -> tuple[torch.Tensor, Callable[[], None]]:
    """The check of the fused loss on CUDA, without stalling the host before the loss's kernels are queued.

    Returns ``(safe_target, finish)``: ``safe_target`` has every bad id replaced by ``ignore_index`` on the
    device (so no kernel reads outside a row), and ``finish()``, called once the loss's kernels are queued, waits
    for the device-side flag (computed before those kernels) and raises the same ValueError as
    :func:`check_labels`. The host then waits only until the GPU reaches the flag, with the whole loss queued
    behind it: no idle GPU, unlike a check that reads the labels back before launching (which made the host
    wait for all earlier work, e.g. the whole decoder forward). Elsewhere (CPU, a CUDA-graph capture: no host
    reads there; the capture keeps the sanitised labels) the check is :func:`check_labels` or none.
    """
    _check_dtype(target)
    if target.numel() == 0:
        return target, _no_check
    if not target.is_cuda:
        check_labels(target, ignore_index, num_classes)
        return target, _no_check
    bad = (target != ignore_index) & ((target < 0) | (target >= num_classes))
    safe = target.masked_fill(bad, ignore_index)
    if torch.cuda.is_current_stream_capturing():
        return safe, _no_check
    flag = torch.empty((), dtype=torch.bool, pin_memory=True)
    flag.copy_(bad.any(), non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()

    def finish() -> None:
        ready.synchronize()
        if bool(flag):
            _raise_bad(target, ignore_index, num_classes)

    return safe, finish


def _raise_bad(target: torch.Tensor, ignore_index: int, num_classes: int) -> None:
    bad = (target != ignore_index) & ((target < 0) | (target >= num_classes))
    ids = target[bad].unique()
    shown = ", ".join(str(i) for i in ids[:SHOWN].tolist()) + (", ..." if ids.numel() > SHOWN else "")
    raise ValueError(
        f"target has {int(bad.sum())} label(s) out of range: {shown}; class ids must be in [0, {num_classes}) "
        f"or equal ignore_index={ignore_index}"
    )
