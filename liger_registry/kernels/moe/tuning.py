"""Tile configs of the MoE grouped GEMMs: a few candidates per shape class, one search per shape, kept on disk.

* :func:`rows_candidates` / :func:`wgrad_candidates`: at most :data:`MAX_CANDIDATES` configs for a shape class
  (the pass, the column and reduction sizes, the routed rows' bucket, the experts, the block rows, the gate's
  layout, the dtype), drawn from what won or did not spill on sm_90 (docs/design/moe-experts.md); every one meets
  the kernels' constraints (:func:`rows_problem`, :func:`wgrad_problem`).
* :class:`Tuner`: a kernel's launches. A shape bucket's config comes from this process's picks, else the disk
  cache (``tune_cache``), else a timed search over the candidates (written to the cache). One candidate (the
  interpreter's, or ``LIGER_REGISTRY_AUTOTUNE=0``: the heuristic's first) is used without a search.
* :func:`compile_side_by_side`: a CUDA search compiles its candidates in threads before timing them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import triton

from ..triton_utils import interpreting
from . import tune_cache

SEARCH_ENV = "LIGER_REGISTRY_AUTOTUNE"
MAX_CANDIDATES = 6
SMEM_BYTES = 227 * 1024  # shared memory a block may opt into on sm_90 (H100 / H200)
TARGET_PROGRAMS = 2 * 132  # two waves of an H100's SMs: a config with fewer programs leaves SMs idle
# ms of warm-up and of timed calls per candidate: a stable median of these GEMMs, a fraction of a compile
WARMUP_MS, REP_MS = 10, 40
GLU_FWD, SCATTER_WEIGHTED, GLU_BWD, SCATTER = 0, 1, 2, 3
GLU_MODES = (GLU_FWD, GLU_BWD)
# the narrowest column block of a rows launch (it sizes the routing weight's partials buffer)
MIN_BN = 16 if interpreting() else 64


# The rows kernel's persistent schedule (a program per SM slot looping over the tiles), off until measured: the
# bench's ``ours:persistent`` turns it on for an A/B; its picks are cached under buckets of their own.
PERSISTENT = False
PROGRAMS_PER_SM = 2


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def program_slots(device: torch.device) -> int:
    """Programs of a persistent launch: ``PROGRAMS_PER_SM`` per SM (3 off the GPU: the interpreter's loop still
    strides)."""
    if device.type != "cuda":
        return 3
    return PROGRAMS_PER_SM * _sm_count(
        device.index if device.index is not None else torch.cuda.current_device()
    )


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """A launch's tile sizes (``meta``: the kernel's block constexprs) and its warps and pipeline stages."""

    meta: tuple[tuple[str, int], ...]
    num_warps: int
    num_stages: int

    @classmethod
    def of(cls, num_warps: int, num_stages: int, **meta: int) -> TileConfig:
        return cls(tuple(sorted(meta.items())), num_warps, num_stages)

    def __getitem__(self, name: str) -> int:
        return dict(self.meta)[name]

    def launch_kwargs(self) -> dict:
        return {**dict(self.meta), "num_warps": self.num_warps, "num_stages": self.num_stages}

    def as_json(self) -> dict:
        return {"meta": dict(self.meta), "num_warps": self.num_warps, "num_stages": self.num_stages}

    @classmethod
    def from_json(cls, data) -> TileConfig | None:
        """The config a cache entry names, or None when it is not one."""
        try:
            meta = {str(k): int(v) for k, v in data["meta"].items()}
            return cls.of(int(data["num_warps"]), int(data["num_stages"]), **meta)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def __str__(self) -> str:
        return (
            ", ".join(f"{k}: {v}" for k, v in self.meta)
            + f", warps {self.num_warps}, stages {self.num_stages}"
        )


# ---------------------------------------------------------------- shape classes and candidates


@dataclasses.dataclass(frozen=True)
class RowsShape:
    """What a rows launch's best tile depends on."""

    mode: int
    n: int
    k: int
    rows: int  # routed rows, rounded up to a power of two
    experts: int
    bm: int
    step: int = 1  # 2: GPT-OSS's interleaved gate/up pairs
    split: bool = False
    elem: int = 2  # bytes per element of the operands


@dataclasses.dataclass(frozen=True)
class WgradShape:
    m: int
    n: int
    rows: int
    experts: int
    elem: int = 2


def _pow2(v: int) -> bool:
    return v >= 16 and v & (v - 1) == 0


def rows_smem(shape: RowsShape, cfg: TileConfig) -> int:
    """Shared memory of the pipelined operand tiles: A [BM, BK], the weight [BK, BN] (twice as wide for
    interleaved pairs; a second for the up half of a split gate/up) per stage."""
    bn, bk = cfg["BN"], cfg["BK"]
    wide = 2 if shape.mode == GLU_FWD and shape.step == 2 else 1
    b_tiles = 2 if shape.mode == GLU_FWD and shape.step == 1 else 1
    return (shape.bm * bk + b_tiles * bk * bn * wide) * shape.elem * cfg.num_stages


def rows_problem(shape: RowsShape, cfg: TileConfig) -> str | None:
    """Why ``cfg`` cannot run ``shape`` on the rows kernel (None: it can)."""
    bn, bk = cfg["BN"], cfg["BK"]
    if not (_pow2(bn) and _pow2(bk)) or cfg["GROUP_M"] < 1:
        return "BN and BK must be powers of two >= 16, GROUP_M >= 1"
    if bn < MIN_BN:
        return f"BN {bn} < {MIN_BN}: the routing weight's partials hold cdiv(N, {MIN_BN}) rows"
    if shape.mode in GLU_MODES and bn > 128:
        return "the GLU modes hold two [BM, BN] accumulators: BN <= 128"
    if cfg.num_warps not in (4, 8) or cfg.num_stages < 1:
        return "4 or 8 warps, at least one stage"
    if not interpreting() and rows_smem(shape, cfg) > SMEM_BYTES:
        return f"{rows_smem(shape, cfg)} bytes of shared memory > {SMEM_BYTES}"
    return None


def wgrad_problem(shape: WgradShape, cfg: TileConfig) -> str | None:
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    if not (_pow2(bm) and _pow2(bn) and _pow2(bk)):
        return "BM, BN and BK must be powers of two >= 16"
    if cfg.num_warps not in (4, 8) or cfg.num_stages < 1:
        return "4 or 8 warps, at least one stage"
    if not interpreting() and (bk * (bm + bn)) * shape.elem * cfg.num_stages > SMEM_BYTES:
        return "shared memory"
    return None


def _rows(*shapes: tuple[int, int, int, int]) -> list[TileConfig]:
    return [TileConfig.of(w, st, BN=bn, BK=bk, GROUP_M=8) for bn, bk, w, st in shapes]


def _fit(
    configs: list[TileConfig], problem: Callable[[TileConfig], str | None], shrink: str
) -> list[TileConfig]:
    """Each config, its reduction block (``shrink``) and then its stages lowered until it fits (wider operands,
    fp32, need it); the distinct ones that fit, in order."""
    out: list[TileConfig] = []
    for cfg in configs:
        while problem(cfg) and cfg[shrink] > 16:
            cfg = TileConfig.of(cfg.num_warps, cfg.num_stages, **{**dict(cfg.meta), shrink: cfg[shrink] // 2})
        while problem(cfg) and cfg.num_stages > 2:
            cfg = TileConfig.of(cfg.num_warps, cfg.num_stages - 1, **dict(cfg.meta))
        if problem(cfg) is None and cfg not in out:
            out.append(cfg)
    return out[:MAX_CANDIDATES]


def rows_candidates(shape: RowsShape) -> list[TileConfig]:
    """The rows kernel's candidates for a shape class, likeliest first (the first is the pick without a
    search). Interleaved pairs (GPT-OSS) keep to 64-column 8-warp GLU blocks (the others spill, ptxas sm_90);
    the split gates take the 128-column blocks Qwen3 picked; the plain GEMMs (down, input gradient) the 256-column
    block that won wherever it leaves SMs enough programs; 64-row blocks (few rows per expert) the 4-warp tiles
    that won there."""
    if interpreting():
        return [TileConfig.of(4, 1, BN=16, BK=16, GROUP_M=4)]
    if shape.mode in GLU_MODES:
        if shape.step == 2:
            cands = _rows((64, 64, 8, 3), (64, 128, 8, 3), (64, 64, 8, 4))
            cands += _rows((128, 64, 8, 3)) if shape.mode == GLU_FWD else []
        elif shape.mode == GLU_BWD:
            cands = _rows((128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 8, 3), (64, 128, 8, 3))
        else:
            cands = _rows((64, 64, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3), (128, 128, 8, 3))
        if shape.bm == 64 and shape.step == 1:
            cands = _rows((128, 64, 4, 4)) + cands
    else:
        cands = _rows((256, 64, 8, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 8, 3))
        blocks = shape.rows // shape.bm + shape.experts
        if blocks * math.ceil(shape.n / 256) < TARGET_PROGRAMS:  # too few programs at 256 columns
            cands = [c for c in cands if c["BN"] < 256] + _rows((64, 64, 4, 4))
        elif shape.rows < 128 * shape.experts:  # mostly partial blocks: the narrower tiles too
            cands.append(*_rows((64, 64, 4, 4)))
    return _fit(cands, functools.partial(rows_problem, shape), "BK")


def _wgrad(*shapes: tuple[int, int, int, int, int]) -> list[TileConfig]:
    return [TileConfig.of(w, st, BM=bm, BN=bn, BK=bk) for bm, bn, bk, w, st in shapes]


def wgrad_candidates(shape: WgradShape) -> list[TileConfig]:
    """The weight-gradient kernel's candidates (its reduction runs over an expert's rows): the square 128 tiles,
    the wide ones where both sides are large and experts have many rows, 32-row steps where they have few."""
    if interpreting():
        return [TileConfig.of(4, 1, BM=16, BN=16, BK=16)]
    per_expert = shape.rows // max(shape.experts, 1)
    cands = _wgrad((128, 128, 64, 8, 3), (128, 128, 32, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4))
    if shape.m >= 2048 and shape.n >= 2048 and per_expert >= 1024:
        cands += _wgrad((128, 256, 64, 8, 3), (256, 128, 64, 8, 3))
    elif per_expert < 256:
        cands = [cands[1], cands[0], *_wgrad((64, 64, 32, 4, 3)), *cands[2:]]
    return _fit(cands, functools.partial(wgrad_problem, shape), "BK")


# ---------------------------------------------------------------- the search and its record


def search_enabled() -> bool:
    """``LIGER_REGISTRY_AUTOTUNE=0``: no search, the heuristic's first candidate (no first-call wait)."""
    return os.environ.get(SEARCH_ENV, "1").strip().lower() not in tune_cache.OFF


def device_name(device: torch.device) -> str:
    """The GPU's name and capability (H100 and H200 are both sm_90 but not the same machine for a tile)."""
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm{major}{minor}"


def time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median ms of ``fn``: Triton's benchmarker on the GPU, the wall clock elsewhere (the interpreter)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))
    fn()
    samples = []
    for _ in range(2):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


@dataclasses.dataclass
class Search:
    """One search of this process: the bucket, what it picked, its candidates' ms, its seconds."""

    kernel: str
    bucket: str
    config: TileConfig
    timings_ms: dict[str, float]
    seconds: float


class Tuner:
    """The launches of one Triton kernel with a tile config per shape bucket (see the module docstring).
    ``sources``: the files whose text makes the kernel (their hash names the cache file)."""

    def __init__(self, name: str, kernel, sources: Sequence[Path]):
        self.name, self.kernel, self.sources = name, kernel, tuple(sources)
        self.picks: dict[str, TileConfig] = {}  # bucket name -> config
        self._known: dict[tuple, TileConfig] = {}  # the same, keyed by the launch's values (the fast path)
        self.searches: list[Search] = []
        self.cached: list[str] = []  # buckets whose config came from the disk cache
        self.defaulted: list[str] = []  # buckets with the heuristic's first config, unsearched

    @functools.cached_property
    def source(self) -> str:
        return tune_cache.source_hash(*(p.read_text() for p in self.sources))

    def disk(self, device: torch.device) -> tune_cache.TuneCache:
        return tune_cache.TuneCache(self.name, self.source, device_name(device), triton.__version__)

    def launch(self, grid, args: tuple, consts: dict, sizes: dict, candidates: Callable[[], list[TileConfig]],
               device: torch.device, restore: Sequence[torch.Tensor] = ()) -> TileConfig:  # fmt: skip
        """Launch with the config of the bucket ``sizes`` + ``consts`` name (searched for first if no process or
        file has it). ``candidates`` is called only then (a launch whose bucket this process knows costs a tuple
        lookup); ``restore``: tensors a trial may leave differently from the zeros the caller gave (restored
        after every trial)."""

        def run(cfg: TileConfig):
            self.kernel[grid](*args, **consts, **cfg.launch_kwargs())

        key = (*sizes.values(), *consts.values())
        cfg = self._known.get(key)
        if cfg is None:  # the first launch of this bucket in this process (the hot path skips all of this)

            def compile_only(cfg: TileConfig):
                self.kernel.warmup(*args, grid=grid, **consts, **cfg.launch_kwargs())

            cfg = self.pick(bucket_name(sizes, consts), candidates(), device, run, restore, compile_only)
            self._known[key] = cfg
        run(cfg)
        return cfg

    def pick(self, bucket: str, candidates: list[TileConfig], device, run, restore=(), compile_only=None):
        """The bucket's config: this process's pick, the disk cache's, or a search's (``run(cfg)`` launches,
        ``compile_only(cfg)`` compiles without launching: the search compiles its candidates side by side)."""
        if (cfg := self.picks.get(bucket)) is not None:
            return cfg
        if len(candidates) == 1 or not search_enabled():
            cfg = candidates[0]
            self.defaulted.append(bucket)
        elif (cfg := self._cached(bucket, candidates, device)) is None:
            if compile_only is not None:
                compile_side_by_side(candidates, compile_only, device)
            cfg = self._search(bucket, candidates, device, run, restore)
        self.picks[bucket] = cfg
        return cfg

    def _cached(self, bucket, candidates, device) -> TileConfig | None:
        entry = self.disk(device).get(bucket)
        cfg = TileConfig.from_json(entry.get("config")) if entry else None
        if cfg is None or cfg not in candidates:  # another heuristic's pick: searched again
            return None
        self.cached.append(bucket)
        return cfg

    def _search(self, bucket, candidates, device, run, restore) -> TileConfig:
        saved = [t.clone() for t in restore]

        def reset():
            for t, s in zip(restore, saved, strict=True):
                t.copy_(s)

        start, timings, failure = time.perf_counter(), {}, None
        for cfg in candidates:
            reset()
            try:
                timings[cfg] = time_ms(lambda cfg=cfg: run(cfg), device)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile here is not a pick
                timings[cfg], failure = math.inf, exc
        reset()
        best = min(timings, key=timings.get)
        if math.isinf(timings[best]):
            raise RuntimeError(f"{self.name}: no candidate config ran for {bucket}") from failure
        seconds = time.perf_counter() - start
        ms = {str(c): t for c, t in timings.items()}
        self.searches.append(Search(self.name, bucket, best, ms, seconds))
        entry = {"config": best.as_json(), "timings_ms": ms, "search_s": seconds}
        self.disk(device).put(bucket, entry)
        return best

    def reset(self) -> None:
        """Forget this process's picks (the next launch of each bucket reads the disk or searches again)."""
        self.picks.clear()
        self._known.clear()
        self.searches.clear()
        self.cached.clear()
        self.defaulted.clear()


def compile_side_by_side(
    candidates: Sequence[TileConfig], compile_only: Callable, device: torch.device
) -> None:
    """Compile every candidate before any is timed: the first alone (it initialises the compiler), the rest in
    threads, which overlap because Triton's compiler releases the GIL for most of its work (ptxas, LLVM). Only on
    CUDA (the interpreter compiles nothing). A config that fails here fails again in the timed loop, which
    records it."""
    if device.type != "cuda" or len(candidates) < 2:
        return

    def build(cfg: TileConfig) -> None:
        with torch.cuda.device(device):  # Triton keys its kernel cache by the thread's current device
            try:
                compile_only(cfg)
            except Exception:  # noqa: BLE001, S110 - the timed loop launches it again and records the error
                pass

    build(candidates[0])
    workers = min(len(candidates) - 1, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(build, candidates[1:]))


def bucket_name(sizes: dict, consts: dict) -> str:
    """The cache key of a launch: its sizes and every constexpr that changes the compiled kernel."""
    return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in {**sizes, **consts}.items())


TUNERS: dict[str, Tuner] = {}


def tuner(name: str, kernel, sources: Sequence[Path]) -> Tuner:
    TUNERS[name] = Tuner(name, kernel, sources)
    return TUNERS[name]


def search_seconds() -> float:
    """Seconds every tuner of this process spent searching."""
    return sum(s.seconds for t in TUNERS.values() for s in t.searches)


def reset() -> None:
    for t in TUNERS.values():
        t.reset()


def picks() -> dict[str, str]:
    """``kernel(bucket) -> config`` of every pick of this process."""
    return {f"{t.name}({b})": str(c) for t in TUNERS.values() for b, c in t.picks.items()}
