"""define_op: the one way a kernel op is defined: implementation, fake, autograd and eager twin from one call.

Every kernel op of this package is a ``torch.library`` custom op ``liger_registry::<name>`` whose last argument is
the backend (``"triton"`` or ``"torch"``) its :class:`~.backend.Op` decided; the op runs that backend and never
decides again, so a direct ``torch.ops.liger_registry.<name>`` call works everywhere. From one
``define_op(name, impl, ...)`` come:

* the custom op (opaque to torch.compile: no graph break, one node with a fake);
* its fake, by default *derived*: ``impl`` run with ``backend="torch"`` on the fake tensors. The PyTorch branch
  of each impl returns exactly the layout the Triton branch writes (rows contiguous; RoPE keeps its input's
  layout), so the fake cannot drift from either; ``opcheck`` proves it per op, backend and layout. An impl whose
  PyTorch branch cannot run on fake tensors (data-dependent shapes) passes ``fake=``;
* its autograd formula (``setup`` + ``backward``), registered on the custom op;
* an eager twin: an ``autograd.Function`` running the same impl, setup and backward without the dispatcher
  round trip (the eager call's launch overhead), taken whenever nothing is being compiled, and entered through
  :func:`fast_apply` (``Function.apply`` less its Python wrapper, which only matters under functorch transforms).

A backward formula calls the backward op with :meth:`KernelOp.from_backward` (the impl itself after an eager
forward, the custom op when AOT traces it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

NS = "liger_registry"


def _is_eager(ctx) -> bool:
    return getattr(ctx, "eager", False)


def eager_twin(name: str, impl: Callable, setup: Callable, backward: Callable, aux: Sequence[int] = ()):
    """The ``autograd.Function`` running ``impl`` with ``setup`` and ``backward`` (``define_op`` makes one per op);
    public for the eager-only variants of an op (another backward on the same impl, e.g. one that overwrites the
    incoming gradient, which a traced backward may not)."""

    def forward(ctx, *inputs):
        out = impl(*inputs)
        ctx.eager = True
        # no zero-filled grads for unused / auxiliary outputs (a loss's saved gradient is as large as the logits)
        ctx.set_materialize_grads(False)
        setup(ctx, inputs, out)
        if aux:
            ctx.mark_non_differentiable(*[out[i] for i in aux])
        return out

    return type(
        f"{name}_eager",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(lambda ctx, *g: backward(ctx, *g))},
    )


_TRANSFORMS_ACTIVE = torch._C._are_functorch_transforms_active


def fast_apply(fn: type[torch.autograd.Function]) -> Callable:
    """``fn.apply`` without ``Function.apply``'s Python layer (binding default arguments for a ``setup_context``
    style Function, unwrapping functorch wrappers left over from a finished transform: ~4 us per call, the
    size of a norm kernel's launch) whenever no functorch transform is active; under one, ``fn.apply`` itself.
    For Functions with a combined ``forward(ctx, ...)`` only (no ``setup_context``: nothing to bind)."""
    if getattr(fn, "setup_context", None) is not torch.autograd.Function.setup_context:
        raise TypeError(f"fast_apply({fn.__name__}): a Function with setup_context needs Function.apply")
    # what Function.apply ends in: the C base's apply, bound to fn
    c_apply, slow = super(torch.autograd.Function, fn).apply, fn.apply

    def apply(*args):
        return slow(*args) if _TRANSFORMS_ACTIVE() else c_apply(*args)

    return apply


@dataclass(frozen=True)
class KernelOp:
    """A defined op: ``op(*args)`` runs the eager twin (or the impl, for an op without autograd) eagerly and the
    custom op under torch.compile."""

    name: str
    impl: Callable
    custom: Callable
    eager: Callable

    def __call__(self, *args):
        return self.custom(*args) if torch.compiler.is_compiling() else self.eager(*args)

    def from_backward(self, ctx, *args):
        """The op called inside another op's backward formula: the impl after an eager forward, else the custom
        op (AOT traces the formula)."""
        return self.impl(*args) if _is_eager(ctx) else self.custom(*args)


def _derived_fake(impl: Callable) -> Callable:
    def fake(*args):
        return impl(*args[:-1], "torch")

    return fake


def define_op(
    name: str,
    impl: Callable,
    *,
    setup: Callable | None = None,
    backward: Callable | None = None,
    fake: Callable | None = None,
    aux: Sequence[int] = (),
    mutates_args: Sequence[str] = (),
) -> KernelOp:
    """Define ``liger_registry::<name>`` from ``impl(*args, backend)`` (type-annotated, as ``torch.library``
    infers the schema from it). ``setup(ctx, inputs, output)`` and ``backward(ctx, *grads)`` give it autograd;
    ``aux``: indices of outputs that are not differentiable (statistics saved for the backward); ``fake``: only
    when the derived one cannot be (see the module docstring); ``mutates_args``: names of arguments written in
    place (such an op has no autograd and returns nothing)."""
    if (setup is None) != (backward is None):
        raise TypeError(f"define_op({name!r}): setup and backward go together")
    custom = torch.library.custom_op(f"{NS}::{name}", impl, mutates_args=tuple(mutates_args))
    custom.register_fake(fake or _derived_fake(impl))
    if backward is None:
        return KernelOp(name, impl, custom, impl)
    torch.library.register_autograd(f"{NS}::{name}", backward, setup_context=setup)
    twin = eager_twin(name, impl, setup, backward, aux)
    return KernelOp(name, impl, custom, fast_apply(twin))
