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

``define_op(..., triton_op=True)`` makes the op a ``torch.library.triton_op`` instead of an opaque custom op: under
torch.compile AOT decomposes it into what its impl does, the Triton launches as ``triton_kernel_wrapper`` nodes
(inductor schedules the kernels with the rest of the graph and sees what they read and write) and the PyTorch
branch as aten ops (inductor fuses them). Its launchers take their kernels through :func:`traceable`, which wraps
them with ``torch.library.wrap_triton`` only while such an op's impl runs, so the eager twin launches the bare
kernel. Kernels loaded in Triton's interpreter are Python functions AOT cannot trace (and tracing the PyTorch
branch in their place would not match the kernel to the bit, which opcheck requires): there an opted-in op stays
an opaque custom op with its derived fake, so only ops with a backend argument and a derived fake may opt in.
docs/design/compile.md records what inductor does with them.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

NS = "liger_registry"
_LAUNCH = threading.local()  # .traceable: a triton_op's impl is running (its launches may be traced)


def launches_traced() -> bool:
    """Whether the impl of an op defined with ``triton_op=True`` is running (its launches may be traced)."""
    return getattr(_LAUNCH, "traceable", False)


def traceable(kernel):
    """``kernel`` as a launcher should call it: through ``torch.library.wrap_triton`` while the impl of an op
    defined with ``triton_op=True`` runs (so that AOT can trace the launch), the bare kernel otherwise (the eager
    twin: no wrapper per launch)."""
    if getattr(_LAUNCH, "traceable", False):
        return torch.library.wrap_triton(kernel)
    return kernel


def _interpreted() -> bool:
    from .triton_utils import INTERPRET_AT_IMPORT

    return INTERPRET_AT_IMPORT


def _traced_impl(impl: Callable) -> Callable:
    """The function given to ``torch.library.triton_op``: ``impl`` with traceable launches."""

    @functools.wraps(impl)
    def fn(*args):
        before = getattr(_LAUNCH, "traceable", False)
        _LAUNCH.traceable = True
        try:
            return impl(*args)
        finally:
            _LAUNCH.traceable = before

    # the schema is inferred from the signature: impl's, its string annotations evaluated in impl's module
    fn.__signature__ = inspect.signature(impl, eval_str=True)
    return fn


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
    triton_op: bool = False,
) -> KernelOp:
    """Define ``liger_registry::<name>`` from ``impl(*args, backend)`` (type-annotated, as ``torch.library``
    infers the schema from it). ``setup(ctx, inputs, output)`` and ``backward(ctx, *grads)`` give it autograd;
    ``aux``: indices of outputs that are not differentiable (statistics saved for the backward); ``fake``: only
    when the derived one cannot be (see the module docstring); ``mutates_args``: names of arguments written in
    place (such an op has no autograd and returns nothing); ``triton_op``: visible to inductor (see the module
    docstring), for an op whose last argument is the backend and whose fake is derived."""
    if (setup is None) != (backward is None):
        raise TypeError(f"define_op({name!r}): setup and backward go together")
    if triton_op and (fake is not None or mutates_args):
        raise TypeError(f"define_op({name!r}): triton_op needs a derived fake and no mutated argument")
    if triton_op and not _interpreted():
        custom = torch.library.triton_op(f"{NS}::{name}", _traced_impl(impl), mutates_args=())
    else:
        custom = torch.library.custom_op(f"{NS}::{name}", impl, mutates_args=tuple(mutates_args))
        custom.register_fake(fake or _derived_fake(impl))
    if backward is None:
        return KernelOp(name, impl, custom, impl)
    torch.library.register_autograd(f"{NS}::{name}", backward, setup_context=setup)
    twin = eager_twin(name, impl, setup, backward, aux)
    return KernelOp(name, impl, custom, fast_apply(twin))
