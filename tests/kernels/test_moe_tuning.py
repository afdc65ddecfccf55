"""MoE tile tuning (kernels/moe/tuning.py, tune_cache.py, pretune.py): the disk cache (its file per kernel,
source, GPU and Triton; atomic merged writes from two processes; a corrupt file ignored with a warning; the off
switch), the candidate heuristic of every shape class against the kernels' constraints, a search through the
interpreter whose pick, cache entry and results are checked against the reference, and `liger-registry tune`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_moe import _inputs, reference

from liger_registry.cli import main as cli_main
from liger_registry.kernels.moe import moe_experts, pretune, tune_cache, tuning

ROOT = Path(__file__).resolve().parents[2]
CACHE_FILE = ROOT / "liger_registry" / "kernels" / "moe" / "tune_cache.py"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tune_cache.CACHE_DIR_ENV, str(tmp_path / "autotune"))
    monkeypatch.delenv(tune_cache.SWITCH_ENV, raising=False)
    monkeypatch.delenv(tuning.SEARCH_ENV, raising=False)
    return tmp_path / "autotune"


def _cache(kernel="moe_rows", source="abc123", device="NVIDIA H100 80GB HBM3 sm90", triton="3.6.0"):
    return tune_cache.TuneCache(kernel, source, device, triton)


# ---------------------------------------------------------------- the disk cache


def test_cache_file_is_named_by_kernel_source_gpu_and_triton(cache_dir):
    names = {
        _cache().path.name,
        _cache(kernel="moe_wgrad").path.name,
        _cache(source="def456").path.name,
        _cache(device="NVIDIA H200 sm90").path.name,
        _cache(triton="3.9.0").path.name,
    }
    assert len(names) == 5
    assert _cache().path == cache_dir / "moe_rows-abc123-nvidia-h100-80gb-hbm3-sm90-triton3.6.0.json"


def test_cache_dir_defaults_under_the_user_cache(monkeypatch):
    monkeypatch.delenv(tune_cache.CACHE_DIR_ENV, raising=False)
    assert tune_cache.cache_dir() == Path.home() / ".cache" / "liger_registry" / "autotune"


def test_cache_round_trip_merges_entries(cache_dir):
    cache = _cache()
    assert cache.read() == {}
    cache.put("N=768", {"config": {"meta": {"BN": 64}, "num_warps": 8, "num_stages": 3}})
    cache.put("N=2048", {"config": {"meta": {"BN": 256}, "num_warps": 8, "num_stages": 3}})
    assert set(cache.read()) == {"N=768", "N=2048"}
    assert cache.get("N=2048")["config"]["meta"] == {"BN": 256}
    data = json.loads(cache.path.read_text())
    assert data["kernel"] == "moe_rows" and data["triton"] == "3.6.0" and data["source"] == "abc123"
    assert not list(cache_dir.glob("*.tmp")), "the temporary file is renamed into place"
    assert _cache(triton="3.9.0").read() == {}, "another Triton reads another file"


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", '{"entries": []}', json.dumps({"format": 1, "entries": {}, "kernel": "other"})],
)
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning_then_replaced(cache_dir, text):
    cache = _cache()
    cache_dir.mkdir(parents=True)
    cache.path.write_text(text)
    with pytest.warns(tune_cache.TuneCacheWarning, match="ignored"):
        assert cache.get("N=768") is None
    with pytest.warns(tune_cache.TuneCacheWarning):
        cache.put("N=768", {"config": {}})
    assert set(json.loads(cache.path.read_text())["entries"]) == {"N=768"}


def test_the_off_switch_neither_reads_nor_writes(cache_dir, monkeypatch):
    _cache().put("N=1", {"config": {}})
    monkeypatch.setenv(tune_cache.SWITCH_ENV, "0")
    assert not tune_cache.enabled() and _cache().read() == {}
    assert _cache().put("N=2", {"config": {}}) is None
    monkeypatch.delenv(tune_cache.SWITCH_ENV)
    assert set(_cache().read()) == {"N=1"}


def test_an_unwritable_cache_dir_is_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(tune_cache.CACHE_DIR_ENV, str(blocker / "autotune"))
    with pytest.warns(tune_cache.TuneCacheWarning, match="not written"):
        assert _cache().put("N=1", {"config": {}}) is None


WRITER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("tune_cache", sys.argv[1])
tc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tc)
cache = tc.TuneCache("moe_rows", "abc123", "gpu", "3.6.0")
for i in range(int(sys.argv[3])):
    cache.put(f"{sys.argv[2]}-{i}", {"config": {"meta": {"BN": 64}, "num_warps": 8, "num_stages": 3}, "i": i})
"""


def test_two_processes_writing_at_once_keep_every_entry(cache_dir):
    """Two writers of the same file, each merging its own entries: the file is whole JSON with all of them."""
    env = {**os.environ, tune_cache.CACHE_DIR_ENV: str(cache_dir)}
    n = 40
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(CACHE_FILE), who, str(n)], env=env)
        for who in ("a", "b")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    entries = _cache(device="gpu").read()
    assert set(entries) == {f"{who}-{i}" for who in "ab" for i in range(n)}


# ---------------------------------------------------------------- the candidates


@pytest.fixture
def gpu_rules(monkeypatch):
    """The heuristic and constraints as on the GPU (the interpreter's single config otherwise)."""
    monkeypatch.setattr(tuning, "interpreting", lambda: False)
    monkeypatch.setattr(tuning, "MIN_BN", 64)


QWEN3 = dict(experts=128, bm=128)
GPT_OSS = dict(experts=32, bm=128, step=2)


def _rows(mode, n, k, rows, **kw):
    return tuning.rows_candidates(tuning.RowsShape(mode, n, k, rows, **kw))


def _tiles(cands):
    return [(c["BN"], c["BK"], c.num_warps, c.num_stages) for c in cands]


SHAPE_CLASSES = [
    (mode, n, k, rows, experts, bm, step, split, elem)
    for mode in range(4)
    for n, k in ((768, 2048), (2048, 1536), (2880, 2880), (14336, 4096), (4096, 28672), (40, 96))
    for rows, experts in ((32768, 128), (131072, 128), (16384, 32), (8192, 8), (512, 64))
    for bm in (64, 128)
    for step, split in ((1, False), (2, False), (1, True))
    for elem in (2, 4)
]


def test_every_shape_class_gets_a_few_valid_candidates(gpu_rules):
    for mode, n, k, rows, experts, bm, step, split, elem in SHAPE_CLASSES:
        shape = tuning.RowsShape(mode, n, k, rows, experts, bm, step, split, elem)
        cands = tuning.rows_candidates(shape)
        assert 1 <= len(cands) <= tuning.MAX_CANDIDATES and len(set(cands)) == len(cands), shape
        for c in cands:
            assert tuning.rows_problem(shape, c) is None, (shape, c)
            assert c["BN"] >= 64 and (mode not in tuning.GLU_MODES or c["BN"] <= 128), (shape, c)
            assert tuning.rows_smem(shape, c) <= tuning.SMEM_BYTES, (shape, c)


def test_the_constraints_refuse_what_the_kernel_cannot_run(gpu_rules):
    glu = tuning.RowsShape(tuning.GLU_BWD, 768, 2048, 32768, 128, 128)
    cfg = tuning.TileConfig.of
    assert "partials" in tuning.rows_problem(glu, cfg(8, 3, BN=32, BK=64, GROUP_M=8))
    assert "two [BM, BN]" in tuning.rows_problem(glu, cfg(8, 3, BN=256, BK=64, GROUP_M=8))
    assert "shared memory" in tuning.rows_problem(glu, cfg(8, 6, BN=128, BK=256, GROUP_M=8))
    assert tuning.rows_problem(glu, cfg(8, 3, BN=128, BK=128, GROUP_M=8)) is None


def test_each_shape_class_gets_its_own_candidates(gpu_rules):
    # Qwen3's picks lead (docs/design/moe-experts.md): GLU_BWD 128x128, the down GEMM 256 columns
    assert _tiles(_rows(tuning.GLU_BWD, 768, 2048, 32768, **QWEN3))[0] == (128, 128, 8, 3)
    assert _tiles(_rows(tuning.SCATTER_WEIGHTED, 2048, 768, 131072, **QWEN3))[0] == (256, 64, 8, 3)
    # GPT-OSS's interleaved GLU modes: only the 64-column 8-warp blocks that do not spill
    bwd = _rows(tuning.GLU_BWD, 2880, 2880, 16384, **GPT_OSS)
    assert {(bn, w) for bn, _, w, _ in _tiles(bwd)} == {(64, 8)} and len(bwd) == 3
    assert (128, 64, 8, 3) in _tiles(_rows(tuning.GLU_FWD, 2880, 2880, 16384, **GPT_OSS))
    # 64-row blocks (few rows per expert): the 4-warp tile that won there first
    assert _tiles(_rows(tuning.GLU_FWD, 768, 2048, 8192, experts=128, bm=64))[0] == (128, 64, 4, 4)
    # too few programs at 256 columns: the narrow tiles instead
    few = _tiles(_rows(tuning.SCATTER, 2048, 1536, 512, experts=4, bm=64))
    assert all(bn < 256 for bn, *_ in few) and (64, 64, 4, 4) in few
    # fp32 operands: the reduction block halves until the pipeline fits shared memory
    fp32 = _rows(tuning.GLU_BWD, 768, 2048, 32768, **QWEN3, elem=4)
    assert _tiles(fp32)[0] == (128, 64, 8, 3)


def test_weight_gradient_candidates(gpu_rules):
    big = tuning.wgrad_candidates(tuning.WgradShape(4096, 14336, 32768, 8))
    assert len(big) == 6 and {(c["BM"], c["BN"]) for c in big} >= {(128, 256), (256, 128)}
    few = tuning.wgrad_candidates(tuning.WgradShape(768, 2048, 8192, 128))
    assert few[0]["BK"] == 32 and len(few) <= tuning.MAX_CANDIDATES
    for c in big + few:
        assert tuning.wgrad_problem(tuning.WgradShape(4096, 14336, 32768, 8, 4), c) in (None, "shared memory")


def test_the_interpreter_gets_one_config_and_no_search():
    shape = tuning.RowsShape(tuning.GLU_FWD, 768, 2048, 32768, 128, 128)
    assert len(tuning.rows_candidates(shape)) == 1
    assert len(tuning.wgrad_candidates(tuning.WgradShape(64, 64, 64, 4))) == 1


def test_tile_config_json_round_trip():
    cfg = tuning.TileConfig.of(8, 3, BN=64, BK=128, GROUP_M=8)
    assert tuning.TileConfig.from_json(json.loads(json.dumps(cfg.as_json()))) == cfg
    assert tuning.TileConfig.from_json({"meta": {"BN": "x"}}) is None
    assert tuning.TileConfig.from_json(None) is None


# ---------------------------------------------------------------- a search through the interpreter

TWO = [
    tuning.TileConfig.of(4, 1, BN=16, BK=16, GROUP_M=4),
    tuning.TileConfig.of(4, 1, BN=32, BK=16, GROUP_M=1),
]


@pytest.fixture
def two_candidates(monkeypatch, cache_dir):
    """Two rows configs to search; the wider one timed fastest (after running the kernel), so the search's pick
    follows a narrower trial that wrote more partial rows."""
    calls = []

    def time_ms(fn, device):
        fn()
        calls.append(1)
        return 1.0 if len(calls) % 2 == 0 else 2.0

    monkeypatch.setenv("LIGER_REGISTRY_BACKEND", "triton")
    monkeypatch.setattr(tuning, "rows_candidates", lambda shape: list(TWO))
    monkeypatch.setattr(tuning, "time_ms", time_ms)
    tuning.reset()
    yield calls
    tuning.reset()


def _check_against_reference(act="swiglu", transposed=False, bias=True):
    x, idx, w, w_gu, w_d, b_gu, b_d = _inputs(act, transposed, bias, inter=40)
    kw = dict(act=act, limit=1.5, alpha=1.702, transposed=transposed)
    out = moe_experts(x, idx, w, w_gu, w_d, b_gu, b_d, **kw)
    want = reference(x, idx, w, w_gu, w_d, b_gu, b_d, act, transposed)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    params = [p for p in (x, w, w_gu, w_d, b_gu, b_d) if p is not None]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    for a, b in zip(torch.autograd.grad(out, params, dy), torch.autograd.grad(want, params, dy), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_search_picks_the_fastest_writes_the_cache_and_a_new_process_reads_it(two_candidates, cache_dir):
    _check_against_reference()  # the routing weight's gradient: partials of the narrower trial restored
    rows = tuning.TUNERS["moe_rows"]
    assert len(rows.searches) == 4 and all(s.config == TWO[1] for s in rows.searches)  # the four modes
    (path,) = cache_dir.glob("moe_rows-*-cpu-triton*.json")
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {s.bucket for s in rows.searches}
    assert all(tuning.TileConfig.from_json(e["config"]) == TWO[1] for e in entries.values())
    tuning.reset()  # as a new process: picks only on disk
    n_timed = len(two_candidates)
    _check_against_reference()
    assert len(two_candidates) == n_timed and not rows.searches and len(rows.cached) == 4


def test_a_corrupt_cache_file_means_a_new_search(two_candidates, cache_dir):
    _check_against_reference()
    (path,) = cache_dir.glob("moe_rows-*.json")
    path.write_text('{"entries": ')
    tuning.reset()
    with pytest.warns(tune_cache.TuneCacheWarning):
        _check_against_reference()
    assert len(tuning.TUNERS["moe_rows"].searches) == 4
    assert len(json.loads(path.read_text())["entries"]) == 4


def test_cache_off_still_searches_but_writes_nothing(two_candidates, cache_dir, monkeypatch):
    monkeypatch.setenv(tune_cache.SWITCH_ENV, "0")
    _check_against_reference()
    assert len(tuning.TUNERS["moe_rows"].searches) == 4 and not cache_dir.exists()


def test_searches_off_take_the_first_candidate_at_once(two_candidates, cache_dir, monkeypatch):
    monkeypatch.setenv(tuning.SEARCH_ENV, "0")
    _check_against_reference(act="clamped_swiglu", transposed=True)
    rows = tuning.TUNERS["moe_rows"]
    assert not two_candidates and not rows.searches and set(rows.picks.values()) == {TWO[0]}


def test_a_cuda_search_compiles_every_candidate_before_timing_any(cache_dir, monkeypatch):
    """On CUDA the search first compiles its candidates, the first alone and the rest in threads, each thread
    on the launch's device. A candidate that fails to compile is left to the timed loop, which times it as
    infinite and picks another."""
    import contextlib
    import threading

    three = [*TWO, tuning.TileConfig.of(4, 1, BN=64, BK=16, GROUP_M=1)]
    events, devices = [], []
    monkeypatch.setattr(tuning, "device_name", lambda device: "fake sm90")
    monkeypatch.setattr(torch.cuda, "device", lambda d: devices.append(d) or contextlib.nullcontext())

    def compile_only(cfg):
        events.append(("compile", cfg, threading.current_thread() is threading.main_thread()))
        if cfg == three[1]:
            raise RuntimeError("out of shared memory")

    def run(cfg):
        events.append(("run", cfg, None))
        if cfg == three[1]:
            raise RuntimeError("out of shared memory")

    monkeypatch.setattr(tuning, "time_ms", lambda fn, device: (fn(), 3.0)[1])
    cuda = torch.device("cuda", 1)
    picked = tuning.Tuner("t", None, ()).pick("b", three, cuda, run, compile_only=compile_only)
    compiles = [e for e in events if e[0] == "compile"]
    assert events[: len(three)] == compiles and {e[1] for e in compiles} == set(three)
    assert compiles[0][1] == three[0] and compiles[0][2]  # the first alone, on the caller's thread
    assert devices == [cuda] * len(three)
    assert picked == three[0] and [e[1] for e in events if e[0] == "run"] == three


def test_off_cuda_the_search_compiles_nothing_ahead():
    seen = []
    tuning.compile_side_by_side(TWO, seen.append, torch.device("cpu"))
    tuning.compile_side_by_side(TWO[:1], seen.append, torch.device("cuda"))
    assert not seen


# ---------------------------------------------------------------- liger-registry tune


def test_tune_cli_runs_every_bucket_through_the_interpreter(capsys, cache_dir):
    tuning.reset()
    assert cli_main(["tune", "moe", "--family", "gpt_oss", "--tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert "GPT-OSS-20B: 32 experts, top-4" in out and str(cache_dir) in out
    for mode in range(4):
        assert f"MODE={mode}," in out
    assert "heuristic" in out and "STEP=2" in out


def test_the_cli_names_every_preset():
    from liger_registry import cli

    assert cli.TUNE_FAMILIES == {name: shape.label for name, shape in pretune.PRESETS.items()}


def test_tune_reads_a_model_config(tmp_path):
    config = {"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768}
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "num_experts": 128, "num_experts_per_tok": 8})
    )
    shape = pretune.shape_from_config(tmp_path)
    assert (shape.experts, shape.top_k, shape.hidden, shape.inter, shape.act) == (128, 8, 2048, 768, "swiglu")
    ffn = {"moe_num_experts": 16, "moe_top_k": 4, "ffn_hidden_size": 10752}
    (tmp_path / "dbrx.json").write_text(
        json.dumps({"model_type": "dbrx", "d_model": 6144, "ffn_config": ffn})
    )
    want = pretune.ExpertsShape("dbrx", 16, 4, 6144, 10752, split=True)
    assert pretune.shape_from_config(tmp_path / "dbrx.json") == want
    (tmp_path / "dense.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    assert cli_main(["tune", "moe", "--config", str(tmp_path / "dense.json")]) == 2


def test_tune_cli_refuses_clearly_without_a_gpu():
    code = textwrap.dedent("""
        import sys
        from liger_registry.cli import main
        sys.exit(main(["tune", "moe", "--family", "qwen3_moe"]))
    """)
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "liger-registry tune: error:" in done.stderr and "no CUDA device" in done.stderr


class _Kernel:
    """Records each launch's grid and keyword arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((grid, kw))


def test_a_known_bucket_launches_without_asking_for_candidates(cache_dir, monkeypatch):
    monkeypatch.setattr(tuning, "time_ms", lambda fn, device: (fn(), 1.0)[1])
    kernel, asked = _Kernel(), []
    tuner = tuning.Tuner("fake", kernel, [CACHE_FILE])

    def candidates():
        asked.append(1)
        return list(TWO)

    cpu = torch.device("cpu")
    for n in (64, 64, 128):
        tuner.launch("grid", (), {"MODE": 0}, {"N": n}, candidates, cpu)
    assert len(asked) == 2 and set(tuner.picks) == {"N=64,MODE=0", "N=128,MODE=0"}
    # each search tried both configs, then each launch ran its pick
    assert [kw["BN"] for _, kw in kernel.launches] == [16, 32, 16, 16, 16, 32, 16]


@pytest.mark.parametrize(
    ("act", "transposed", "bias"),
    [("swiglu", False, True), ("clamped_swiglu", True, True), ("limited_swiglu", False, False)],
)
def test_the_persistent_schedule_matches_the_reference(monkeypatch, cache_dir, act, transposed, bias):
    """``tuning.PERSISTENT``: 3 programs stride over every (row block, column block) tile, idle blocks included;
    forward and every gradient as the per-token reference, and its picks kept under buckets of their own."""
    monkeypatch.setenv("LIGER_REGISTRY_BACKEND", "triton")
    monkeypatch.setattr(tuning, "PERSISTENT", True)
    tuning.reset()
    launched = []
    real = tuning.Tuner.launch

    def spy(self, grid, args, consts, sizes, candidates, device, restore=()):
        if self.name == "moe_rows":
            tiles = -(-sizes["N"] // 16) * 2  # at least: 74 routed rows make two 64-row blocks or more
            launched.append((consts["PERSISTENT"], grid({"BN": 16})[0], tiles))
        return real(self, grid, args, consts, sizes, candidates, device, restore)

    monkeypatch.setattr(tuning.Tuner, "launch", spy)
    _check_against_reference(act, transposed, bias)
    assert len(launched) == 4 and all(p and programs == 3 < tiles for p, programs, tiles in launched)
    assert all("PERSISTENT=1" in b for b in tuning.TUNERS["moe_rows"].picks)
    tuning.reset()
