"""The backend of every kernel op: what it supports and the one rule that picks Triton or PyTorch per call.

Backend choice, read at call time from ``LIGER_REGISTRY_BACKEND``:

* ``auto`` (default): CUDA tensors run Triton, CPU tensors run the PyTorch implementation.
  A CUDA call the Triton path cannot serve (e.g. float64) runs PyTorch; the reasons say why.
* ``triton``: always Triton. On CPU tensors the kernels run through Triton's interpreter
  (``TRITON_INTERPRET=1`` must be set before triton is imported). Anything the Triton path
  cannot run raises :class:`BackendError` listing every reason; there is no silent fallback.
* ``torch``: always the PyTorch implementation.

:meth:`Op.decide` is the one rule: it walks the reasons why Triton cannot serve the call lazily and stops at
the first, so the common Triton call builds no list; the full list is built only when Triton is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

ENV_VAR = "LIGER_REGISTRY_BACKEND"
BACKENDS = ("auto", "triton", "torch")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

try:
    from .triton_utils import INTERPRET_AT_IMPORT as _INTERPRETED

    _TRITON_OK = True
except ImportError:  # pragma: no cover - triton is a dependency on Linux
    _INTERPRETED = False
    _TRITON_OK = False


class BackendError(RuntimeError):
    """The requested backend cannot run this call; the message lists every reason."""


def requested_backend() -> str:
    """The value of ``LIGER_REGISTRY_BACKEND`` (default ``auto``), validated; read on every call."""
    raw = os.environ.get(ENV_VAR, "auto")
    value = raw.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={raw!r} is not a valid backend; expected one of {', '.join(BACKENDS)}")
    return value


class TensorSpec(NamedTuple):
    """What the backend rule reads of a tensor: its device and dtype (for a decision without tensors)."""

    device: torch.device
    dtype: torch.dtype


def tensor_reasons(
    tensors: Iterable[torch.Tensor | TensorSpec], dtypes: tuple[torch.dtype, ...], backend: str
) -> Iterator[str]:
    """Reasons shared by every op why its Triton path cannot run on these tensors, lazily."""
    devices = {t.device for t in tensors}
    if not devices and backend == "auto":
        yield "no tensor argument and backend is auto"
    if len(devices) > 1:
        yield f"tensors on several devices: {sorted(str(d) for d in devices)}"
    for t in tensors:
        if t.dtype.is_floating_point and t.dtype not in dtypes:
            yield f"dtype {str(t.dtype).replace('torch.', '')} not supported"
            break
    kinds = {d.type for d in devices}
    if kinds - {"cpu", "cuda"}:
        yield f"device {sorted(str(d) for d in devices)} not supported by the Triton kernels"
    if "cpu" in kinds:
        if backend == "auto":
            yield "tensor on cpu and backend is auto"
        elif not _INTERPRETED:
            yield (
                "tensor on cpu and the Triton kernels were not loaded in interpreter mode "
                "(set TRITON_INTERPRET=1 before triton and liger_registry are imported)"
            )


@dataclass(frozen=True)
class Op:
    """One kernel op: a PyTorch implementation, an optional Triton one, and the rule choosing between them.

    ``extra_check(*args, **kwargs)`` adds op-specific reasons (e.g. a shape limit of a kernel).
    """

    name: str
    torch_impl: Callable
    triton_impl: Callable | None = None
    dtypes: tuple[torch.dtype, ...] = TRITON_DTYPES
    extra_check: Callable[..., list[str]] | None = None

    def _why_not(self, backend: str, tensors: list, args: tuple, kwargs: dict) -> Iterator[str]:
        if self.triton_impl is None:
            yield f"op {self.name} has no Triton implementation"
        if not _TRITON_OK:  # pragma: no cover
            yield "triton is not installed"
        yield from tensor_reasons(tensors, self.dtypes, backend)
        if self.extra_check is not None and args:
            yield from self.extra_check(*args, **kwargs)

    def _decide(self, tensors: list, args: tuple, kwargs: dict) -> tuple[str, list[str]]:
        backend = requested_backend()
        if backend == "torch":
            return "torch", [f"{ENV_VAR}=torch"]
        reasons = self._why_not(backend, tensors, args, kwargs)
        first = next(reasons, None)
        if first is None:
            return "triton", []
        every = [first, *reasons]
        if backend == "auto":
            return "torch", every
        raise BackendError(f"{ENV_VAR}=triton but op {self.name} cannot run on Triton: " + "; ".join(every))

    def decide(self, *args: object, **kwargs: object) -> tuple[str, list[str]]:
        """``(backend, reasons)`` for this call: ``"triton"`` with no reasons, or ``"torch"`` with the reasons
        why not Triton. A forced Triton (``LIGER_REGISTRY_BACKEND=triton``) that cannot run raises
        :class:`BackendError` with every reason."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return self._decide(tensors, args, kwargs)

    def why_not(self, *args: object, backend: str | None = None, **kwargs: object) -> list[str]:
        """Every reason the Triton path cannot run this call under ``backend`` (default: the current setting);
        never raises."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return list(self._why_not(backend or requested_backend(), tensors, args, kwargs))

    def __call__(self, *args: object, **kwargs: object):
        backend, _ = self.decide(*args, **kwargs)
        return (self.triton_impl if backend == "triton" else self.torch_impl)(*args, **kwargs)


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    OPS[op.name] = op
    return op


def decide_backend(op_name: str, device: str | torch.device, dtype: torch.dtype) -> tuple[str, list[str]]:
    """The backend ``op_name`` would use now for tensors of this device and dtype, and why not Triton.

    No tensor is needed; checks that depend on a shape (e.g. a row kernel's column limit) are not applied.
    Forced Triton that cannot run raises :class:`BackendError`, as a call would.
    """
    if op_name not in OPS:
        raise KeyError(f"unknown op {op_name!r}; known: {', '.join(sorted(OPS))}")
    return OPS[op_name]._decide([TensorSpec(torch.device(device), dtype)], (), {})


def backend_for(*tensors: torch.Tensor, op: str | None = None) -> str:
    """The backend a call on these tensors would use now (``"triton"`` or ``"torch"``).

    Without ``op`` only the device rule and the environment variable are applied; with ``op`` that op's
    whole rule is (and a forced, impossible Triton raises :class:`BackendError`).
    """
    if op is not None:
        return OPS[op].decide(*tensors)[0]
    backend = requested_backend()
    if backend != "auto":
        return backend
    return "triton" if any(t.device.type == "cuda" for t in tensors) else "torch"


def why_not_triton(op: str, *args: object, **kwargs: object) -> list[str]:
    """Reasons the Triton path of ``op`` cannot run these arguments under the current backend setting."""
    return OPS[op].why_not(*args, **kwargs)
