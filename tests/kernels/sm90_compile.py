"""Compile the Triton launches that a CPU run made for Hopper (sm_90), without a GPU.

The interpreter (``TRITON_INTERPRET=1``) never runs Triton's compiler, so a kernel that only fails to compile
(a non-constexpr global, a type error in a branch the interpreter accepts) or that spills registers passes the
CPU suite and fails on the first GPU. ``record_launches`` notes each interpreted launch (kernel, argument types,
constexpr values, launch options); ``compile_for_sm90`` compiles every distinct one in a subprocess with the
interpreter off and returns, per launch, the error or the registers and stack (spill) bytes of the cubin.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

DTYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _type_of(value) -> str | None:
    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    return None  # None and other Python values are compile-time constants


def _constant(value):
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


@contextlib.contextmanager
def record_launches():
    """Yields a list that fills with one record per interpreted launch:
    ``{"module", "kernel", "signature", "constexprs", "options"}``."""
    from triton.runtime.interpreter import InterpretedFunction

    records: list[dict] = []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        bound = dict(zip(self.arg_names, args, strict=False))
        bound.update({k: v for k, v in kwargs.items() if k in self.arg_names})
        signature, constexprs = {}, {}
        constexpr_names = {p.name for p in _params(self.fn) if p.is_constexpr}
        for name in self.arg_names:
            value = bound.get(name)
            kind = None if name in constexpr_names else _type_of(value)
            if kind is None:
                signature[name] = "constexpr"
                constexprs[name] = _constant(value)
            else:
                signature[name] = kind
        records.append(
            {
                "module": self.fn.__module__,
                "kernel": self.fn.__name__,
                "signature": signature,
                "constexprs": constexprs,
                "options": {k: v for k, v in kwargs.items() if k in OPTIONS},
            }
        )
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield records
    finally:
        InterpretedFunction.run = original


def _params(fn):
    """Each parameter of a kernel's Python function with ``is_constexpr`` (annotated ``tl.constexpr``)."""
    import inspect
    from types import SimpleNamespace

    out = []
    for p in inspect.signature(fn).parameters.values():
        ann = p.annotation
        text = ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))
        out.append(SimpleNamespace(name=p.name, is_constexpr="constexpr" in str(text)))
    return out


def distinct(records: list[dict]) -> list[dict]:
    seen, out = set(), []
    for r in records:
        key = json.dumps(r, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def compile_for_sm90(records: list[dict], timeout_s: float = 600.0) -> list[dict]:
    """Each distinct record with ``error`` (None when it compiled), ``regs`` and ``stack`` (bytes per thread)."""
    todo = distinct(records)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(todo),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sm_90 compile subprocess failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def _resources(cubin: bytes) -> tuple[int | None, int | None]:
    import re
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    return (int(regs.group(1)) if regs else None, int(stack.group(1)) if stack else None)


def _compile_one(record: dict) -> dict:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(record["module"]), record["kernel"])
    index = {name: i for i, name in enumerate(fn.arg_names)}
    constexprs = {(index[k],): v for k, v in record["constexprs"].items()}
    src = ASTSource(fn, record["signature"], constexprs=constexprs)
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=record["options"])
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return {**record, "error": f"{type(exc).__name__}: {exc}"[-1500:], "regs": None, "stack": None}
    regs, stack = _resources(compiled.asm["cubin"])
    return {**record, "error": None, "regs": regs, "stack": stack}


def _main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    records = json.loads(sys.stdin.read())
    print(json.dumps([_compile_one(r) for r in records]))


if __name__ == "__main__":
    _main()
