"""The allowed ranges of the numeric knobs (chunk constants, MiB budget, ignore_index, logit factors).

One table for the YAML schemas, the keyword overrides and the kernels, so an absurd value (``10**30``) is refused
where it is written, with the range, instead of overflowing inside a kernel or a custom op's int64 argument.
"""

from __future__ import annotations

# C beyond the vocabulary size changes nothing (one token chunk per call); 2**20 covers every vocabulary.
MAX_CHUNK_MEM_CONST = 2**20
# 1 PiB of logits buffer: more than any device holds, far below float overflow.
MAX_CHUNK_MIB = float(2**30)
# labels are int64 (or int32) tensors; the ignore value must be one of them.
IGNORE_INDEX_MIN, IGNORE_INDEX_MAX = -(2**63), 2**63 - 1
# softcap and logit_scale multiply fp32 logits; beyond this they overflow to inf and the loss to NaN.
MAX_LOGIT_FACTOR = 1e30


def check_ignore_index(ignore_index: object) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"ignore_index must be an int, got {ignore_index!r}")
    if not IGNORE_INDEX_MIN <= ignore_index <= IGNORE_INDEX_MAX:
        raise ValueError(f"ignore_index must be in the int64 range [-2**63, 2**63 - 1], got {ignore_index}")
    return ignore_index


def check_logit_factor(name: str, value: float) -> float:
    if not 0.0 < value <= MAX_LOGIT_FACTOR:
        raise ValueError(f"{name} must be in (0, {MAX_LOGIT_FACTOR:g}], got {value!r}")
    return value
