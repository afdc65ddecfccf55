"""CPU smoke runs of the GPU benchmarks (flce, moe, e2e, step), and the benches' own logic (job order, ratios,
targets, loss checks), so they cannot rot unnoticed. flce and moe run in this process (torch and the package are
imported once); e2e and step fork their runs from a driver that must not have run torch yet (a fork after torch's
CPU thread pool started can hang the child), so they run as ``python -m benchmarks`` in a fresh process."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import e2e as bench_e2e
from benchmarks import flce as bench_flce
from benchmarks import moe as bench_moe
from benchmarks import step as bench_step

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    """``python -m benchmarks ARGS`` from the repository root, as the README says to run it."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH")] if p),
    }
    cmd = [sys.executable, "-m", "benchmarks", *args]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _json(out: Path, stem: str) -> dict:
    (path,) = out.glob(f"{stem}_cpu_*.json")
    return json.loads(path.read_text())


def test_e2e_cpu_smoke(tmp_path: Path) -> None:
    args = ["--cpu-smoke", "--models", "llama", "--layers", "2", "--repeats", "1", "--methods", "hf,ours"]
    stdout = _run("e2e", *args, "--out", str(tmp_path))
    assert stdout.rstrip().splitlines()[-1].startswith("targets:"), stdout[-2000:]  # the table comes last
    data = _json(tmp_path, "bench_e2e")
    runs = {r["method"]: r for r in data["runs"]}
    assert set(runs) == {"hf", "ours"}
    for r in runs.values():
        assert r["ok"], r.get("error")
        assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"])
        assert r["tokens_per_s"] > 0
    assert "forward" in runs["ours"]["patched"]  # the forward carries the fused head
    # same seed, same data: the patched model's loss curve is the unpatched one's (fp32, CPU)
    assert max(abs(a - b) for a, b in zip(runs["ours"]["losses"], runs["hf"]["losses"], strict=True)) < 1e-4
    (row,) = data["rows"]
    assert row["ratios"]["ours/hf"] > 0 and row["targets"][">=1.0x HF"] is not None
    csv_rows = (tmp_path / "measurements.csv").read_text().splitlines()
    assert any(",e2e,llama L2 T64,ours,tokens_per_s," in line for line in csv_rows)


def test_e2e_jobs_interleave_methods_per_configuration() -> None:
    module = bench_e2e
    jobs = module.jobs_of(module.parse(["--models", "llama,qwen3", "--layers", "2", "--tokens", "4096"]))
    n = len(module.METHODS)
    assert len(jobs) == 2 * 2 * n  # repeats x configurations x methods
    for start in range(0, len(jobs), n):  # each configuration's methods run next to each other
        block = jobs[start : start + n]
        assert len({(j["model"], j["repeat"]) for j in block}) == 1
        assert sorted(j["method"] for j in block) == sorted(module.METHODS)
    firsts = [jobs[s]["method"] for s in range(0, len(jobs), n)]
    assert len(set(firsts)) > 1  # the order rotates, no method always goes first


def test_e2e_judges_the_compiled_methods_against_each_other() -> None:
    module = bench_e2e
    method = lambda tps: {"tps": tps, "peak": 1.0}  # noqa: E731
    row = {"methods": {"hf": method(100.0), "hf_compile": method(120.0), "ours_compile": method(114.0)}}
    module.judge(row)
    assert row["ratios"]["oc/hc"] == 114.0 / 120.0
    assert row["targets"]["compiled>=1.0x"] is False
    assert module.base_method("ours_compile") == "ours" and module.base_method("hf") == "hf"


def test_flce_cpu_smoke(tmp_path: Path, capsys) -> None:
    methods = "gemms,unpatched,cce,liger,torch_native,ours,ours C=8"
    argv = ["--cpu-smoke", "--shapes", "llama", "--bt", "200", "--methods", methods, "--out", str(tmp_path)]
    assert bench_flce.main([*argv, "--inputs", "confident,random"]) == 0
    stdout = capsys.readouterr().out
    assert stdout.rstrip().splitlines()[-1].startswith("targets:"), stdout[-2000:]
    data = _json(tmp_path, "bench_flce")
    # one row per head, tokens and method of the headline; the other methods are variants
    rows = {r["method"]: r for r in data["rows"]}  # BT 200: not a multiple of the smoke chunks
    assert set(rows) == {"unpatched", "cce", "liger", "torch_native", "ours"}
    assert {r["method"] for r in data["variants"]} == {"gemms", "ours C=8"}
    rate = data["meta"]["dense"]
    assert rate["tflops"] > 0 and rate["n"] == bench_flce.SMOKE_DENSE_N
    floor = 6 * 200 * 32 * 500 / (rate["tflops"] * 1e12) * 1e3  # the smoke llama head: H 32, V 500
    for method in ("unpatched", "ours", "torch_native"):
        r = rows[method]
        assert (r["head"], r["tokens"], r["inputs"]) == ("llama", 200, "confident")
        assert r["ms"] == r["confident_ms"] > 0 and r["random_ms"] > 0, r
        assert r["x_floor"] == pytest.approx(r["ms"] / floor)
        assert r["x_unpatched"] == pytest.approx(r["ms"] / rows["unpatched"]["ms"])
        assert "peak_mib" in r  # None on the CPU
    ours = rows["ours"]
    # 200 tokens > H 32: the long-sequence target does not apply below 4096 tokens, the short one not above H
    assert set(ours["targets"]) == {"<=every peer", "peak<=1.10x cce"}
    assert ours["targets"]["<=every peer"] == (ours["ms"] <= rows["torch_native"]["ms"])
    assert ours["targets"]["peak<=1.10x cce"] is None  # no cce row measured
    assert rows["cce"]["error"] == "cce needs CUDA" and rows["liger"]["error"] == "liger needs CUDA"
    checks = {c["method"]: c for c in data["loss_check"]}
    for method in ("unpatched", "ours", "torch_native"):
        assert checks[method]["loss_rel"] < 1e-5 and checks[method]["dw_rel"] < 1e-4, checks[method]
    # the confident inputs: a loss of about 2, as the issue's table and ANCHORS.md's confident rows
    assert 1.0 < checks["ours"]["loss"] < 3.5


def test_flce_ours_runs_the_budget_the_registry_gives_the_head(tmp_path: Path, monkeypatch) -> None:
    assert bench_flce.head_budget("llama") == {"chunk_mem_const": 1}
    assert bench_flce.head_budget("gpt_oss") == {"chunk_mem_const": 8}  # the bundled GPT-OSS policy
    assert bench_flce.head_budget("not_a_model_type") == {}
    # a sweep stopped before its end (here: the loss check fails) keeps the groups it finished
    monkeypatch.setattr(bench_flce, "loss_check", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    argv = ["--cpu-smoke", "--shapes", "gpt_oss", "--bt", "64", "--methods", "unpatched,ours", "--out"]
    with pytest.raises(RuntimeError, match="stop"):
        bench_flce.main([*argv, str(tmp_path), "--no-repeat"])
    data = _json(tmp_path, "bench_flce")
    (ours,) = [r for r in data["rows"] if r["method"] == "ours"]
    assert ours["kwargs"] == {"chunk_mem_const": 8} and ours["ms"] > 0
    assert data["loss_check"] is None and not (tmp_path / "measurements.csv").exists()


def test_flce_targets_of_ours() -> None:
    ours = {"method": "ours", "tokens": 4096, "H": 4096, "ms": 11.0, "x_floor": 1.12, "peak_mib": 1100.0}
    peers = [
        {"method": "cce", "ms": 12.0, "peak_mib": 1000.0},
        {"method": "liger", "ms": 10.5, "peak_mib": 1300.0},
        {"method": "torch_native", "error": "skipped"},
    ]
    got = bench_flce.targets_of(ours, peers)
    assert got == {
        "<=1.15x floor": True,
        "<=1.10x floor": False,  # tokens <= H: the tighter target
        "<=every peer": False,  # liger is faster
        "peak<=1.10x cce": True,
    }
    assert ours["x_liger"] == pytest.approx(11.0 / 10.5) and "x_torch_native" not in ours
    short = dict(ours, tokens=2048, x_floor=1.05)
    assert bench_flce.targets_of(short, peers[:1]) == {
        "<=1.10x floor": True,
        "<=every peer": True,
        "peak<=1.10x cce": True,
    }


def test_flce_confident_inputs_have_a_loss_of_about_two() -> None:
    for h, v in ((64, 4000), (48, 9000)):
        w = bench_flce.make_weight(h, v, "cpu", torch.float32)
        x, t = bench_flce.make_hidden(512, w, "confident")
        loss = torch.nn.functional.cross_entropy(x.detach() @ w.detach().t(), t).item()
        assert 1.6 < loss < 2.8, loss
        x, t = bench_flce.make_hidden(512, w, "random")
        assert torch.nn.functional.cross_entropy(x.detach() @ w.detach().t(), t).item() > 5.0


def test_flce_plan_table_needs_no_gpu(capsys) -> None:
    assert bench_flce.main(["--plan-table", "--shapes", "llama", "--bt", "2048", "--gpu", "NVIDIA H100"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("llama")]
    assert [line.split()[4] for line in lines] == ["C=1", "C=8", "512MiB"]  # one line per budget


def _plugin():
    path = ROOT / "tests" / "convergence" / "force_flce_strategy.py"
    spec = importlib.util.spec_from_file_location("force_flce_strategy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_force_flce_strategy_plugin_injects_and_checks_the_strategy(monkeypatch) -> None:
    from types import SimpleNamespace

    monkeypatch.setenv("FORCE_FLCE_STRATEGY", "vocab")
    plugin = _plugin()
    calls, reverted = [], []

    def fake_apply(model, **kwargs):  # resolves what it was given, or "auto" when the knob is dropped
        calls.append(kwargs)
        flce = SimpleNamespace(
            enabled=True, strategy=kwargs.get("resolved", kwargs.get("flce_strategy", "auto"))
        )
        config = SimpleNamespace(entry=SimpleNamespace(flce=flce))
        return SimpleNamespace(
            report=SimpleNamespace(config=config, family="llama"), revert=lambda: reverted.append(1)
        )

    forced = plugin._forced_apply(fake_apply)
    forced("model", chunk_mem_const=8)
    assert calls[-1] == {"chunk_mem_const": 8, "flce_strategy": "vocab"} and plugin.FORCED == ["llama"]
    forced("model", flce_strategy="tokens")  # an explicit strategy of the test wins
    assert calls[-1]["flce_strategy"] == "tokens"
    with pytest.raises(RuntimeError, match="resolved 'auto'"):  # the knob did not reach the resolved spec
        forced("model", resolved="auto")
    assert reverted == [1]  # and the patch is taken back


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="CPU Triton needs the interpreter"
)
def test_probe_norm_host_records_each_norm_kernel_grid(monkeypatch) -> None:
    """probe_norm_host's launch-parameter table: every norm kernel a LayerNorm / RMSNorm step launches is recorded
    with its grid, and the kernels are restored afterwards (the rest of the probe needs CUDA)."""
    import torch

    from liger_registry import kernels as K
    from liger_registry.kernels.norm import triton_kernels

    probe = importlib.import_module("benchmarks.probes.norm_host")
    monkeypatch.setenv(K.ENV_VAR, "triton")
    before = {name: getattr(triton_kernels, name) for name in probe.KERNELS}
    grids, undo = probe.record_grids()
    x = torch.randn(8, 40, requires_grad=True)
    w, b = torch.randn(40, requires_grad=True), torch.randn(40, requires_grad=True)
    K.layer_norm(x, w, b, 1e-5).sum().backward()
    K.rms_norm(x, w, 1e-6).sum().backward()
    undo()
    assert {name: getattr(triton_kernels, name) for name in probe.KERNELS} == before
    assert grids["_ln_fwd_kernel"] == grids["_rms_fwd_kernel"] == {(8,)}  # one program per row
    assert grids["_ln_bwd_kernel"] == grids["_rms_bwd_kernel"] == {(4,)}  # row_programs on the CPU
    assert grids["_sum_parts_kernel"] == {(1, 2), (1, 1)}  # dw + db in one launch; dw alone


def test_step_cpu_smoke_and_merge(tmp_path: Path) -> None:
    stdout = _run("step", "--cpu-smoke", "--models", "llama3_2_1b", "--out", str(tmp_path))
    assert stdout.rstrip().splitlines()[-1].startswith("targets:"), stdout[-2000:]  # the table comes last
    data = _json(tmp_path, "bench_step")
    assert not data["meta"]["partial"]
    runs = data["runs"]
    (probe,) = [r for r in runs if r["method"] == "probe"]
    assert probe["ok"] and probe["mm_tflops"] > 0
    measured = [r for r in runs if r["method"] != "probe"]
    expected = [("llama3_2_1b", method, rep) for method in ("hf", "ours") for rep in (0, 1)]
    expected += [("llama3_2_1b", "hf_noise", 0)]
    assert sorted((r["model"], r["method"], r["repeat"]) for r in measured) == sorted(expected)
    for r in measured:
        assert r["ok"], r.get("error")
        assert len(r["losses"]) == 3 and all(math.isfinite(x) for x in r["losses"])
        assert r["flops"]["total"] > r["flops"]["matmul"] > 0 and r["mm_tflops"] == probe["mm_tflops"]
    assert "forward" in next(r for r in measured if r["method"] == "ours")["patched"]
    rows = {row["model"]: row for row in data["rows"]}
    for row in rows.values():
        check = row["loss_check"]
        # fp32 on the CPU: ours follows HF to rounding, the perturbed HF run sets a band well above that
        assert check["band_noise"] > 0 and check["within"]["ours"] is True, check
        assert row["methods"]["ours"]["mfu_median"] > 0
    assert set(rows["llama3_2_1b"]["targets"]) == {
        "ours>=1.35x hf",
        "ours>=1.15x liger",
        "oc>=1.10x hc",
        "peak<=liger",
    }
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None  # the bench extra
    for png in data["meta"]["png"]:
        assert Path(png).is_file() if has_matplotlib else png.startswith("not drawn (No module named"), png

    # a run split over device calls: joined from its JSONs, without running anything
    merged_dir = tmp_path / "merged"
    (path,) = tmp_path.glob("bench_step_cpu_*.json")
    assert bench_step.main(["--merge", str(path), "--out", str(merged_dir)]) == 0
    merged = _json(merged_dir, "bench_step-merged")
    assert [r["model"] for r in merged["rows"]] == [r["model"] for r in data["rows"]]


def test_step_flops_count_matmuls_and_the_keys_each_query_sees() -> None:
    step = bench_step
    assert step.mean_keys(4, None) == 2.5 == step.mean_keys(4, 8)
    assert step.mean_keys(4, 2) == sum(min(i, 2) for i in range(1, 5)) / 4
    dense = dict(
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=16,
        vocab_size=10,
        sliding_window=2,
        layer_types=["sliding_attention", "full_attention"],
    )
    f = step.step_flops(dense, 1, 4)
    per_layer = 8 * 4 * (2 * 2 + 2 * 1) + 3 * 8 * 16  # q, k, v, o + gate, up, down
    assert f["matmul_params"] == 2 * per_layer + 8 * 10
    assert f["matmul"] == 6 * f["matmul_params"] * 4
    assert f["attention"] == 12 * 2 * 4 * (1.75 + 2.5) * 4
    moe = {
        **dense,
        "layer_types": None,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 3,
    }
    f = step.step_flops(moe, 2, 4)
    assert f["matmul_params"] == 2 * (8 * 4 * 6 + 2 * 3 * 8 * 3 + 8 * 6) + 8 * 10  # top-2 experts + router
    llama4 = {**moe, "model_type": "llama4_text", "moe_intermediate_size": None, "num_experts_per_tok": 1}
    f = step.step_flops(llama4, 2, 4)  # top-1 expert + router + the shared expert, each of intermediate_size
    assert f["matmul_params"] == 2 * (8 * 4 * 6 + 3 * 8 * 16 + 8 * 6 + 3 * 8 * 16) + 8 * 10


def test_step_jobs_rotate_methods_and_run_the_noise_reference_once() -> None:
    step = bench_step
    args = step.parse(["--models", "llama3_2_1b,qwen3_1_7b", "--shapes", "2x4096", "--compile-repeats", "1"])
    jobs = step.jobs_of(args)
    first = [j for j in jobs if j["repeat"] == 0]
    second = [j for j in jobs if j["repeat"] == 1]
    assert len(first) == 2 * (len(step.METHODS) + 1) and len(second) == 2 * 3  # repeat 1: hf, liger, ours
    assert sum(j["method"] == step.NOISE for j in jobs) == 2 and all(
        j["method"] != step.NOISE for j in second
    )
    assert {j["method"] for j in second} == {"hf", "liger", "ours"}
    assert len({jobs[0]["method"], second[0]["method"], first[len(first) // 2]["method"]}) > 1  # rotated
    job = next(j for j in jobs if j["model"] == "llama3_2_1b")
    assert (job["batch"], job["seq"], job["tokens"], job["layers"]) == (2, 4096, 8192, 16)
    assert next(j for j in step.jobs_of(step.parse(["--models", "llama3_8b"])))["layers"] == 8
    compiled = next(j for j in jobs if j["method"] == "ours_compile")
    assert compiled["timeout_s"] == 2 * args.timeout_s


def test_step_noise_draws_are_separate_perturbations() -> None:
    step = bench_step
    args = step.parse(
        ["--models", "gpt_oss", "--shapes", "2x4096", "--methods", "hf,ours", "--noise-draws", "3"]
    )
    noise = [j for j in step.jobs_of(args) if j["method"] == step.NOISE]
    assert [j["repeat"] for j in noise] == [0, 1, 2]
    assert sum(j["method"] == "ours" for j in step.jobs_of(args)) == args.repeats  # draw 3 adds no other run
    with pytest.raises(SystemExit, match="at least 1"):
        step.jobs_of(step.parse(["--models", "gpt_oss", "--noise-draws", "0"]))


def test_step_loss_check_against_hf_noise_and_the_targets() -> None:
    step = bench_step

    def method(tps, peak, *curves):
        return {"tps": tps, "peak": peak, "curves": list(curves)}

    row = {
        "model": "llama3_2_1b",
        "methods": {
            "hf": method(100.0, 30.0, [3.0, 2.0, 1.0], [3.0, 2.0, 1.0005]),
            step.NOISE: method(100.0, 30.0, [3.002, 2.0, 1.0]),
            "ours": method(140.0, 17.0, [3.001, 2.0, 1.0], [3.0, 2.0015, 1.0]),
            "liger": method(120.0, 17.5, [3.01, 2.0, 1.0]),
        },
    }
    step.loss_check(row)
    check = row["loss_check"]
    assert check["band_repeats"] == pytest.approx(5e-4) and check["band"] == pytest.approx(2e-3)
    assert check["within"] == {"hf": True, "ours": True, "liger": False}
    step.judge(row)
    assert row["targets"] == {
        "ours>=1.35x hf": True,
        "ours>=1.15x liger": True,
        "oc>=1.10x hc": None,
        "peak<=liger": True,
    }
    row["model"] = "qwen3_moe"  # MoE rows are reported without targets
    step.judge(row)
    assert row["targets"] == {} and row["ratios"]["ours/liger"] == pytest.approx(140 / 120)


def test_step_distance_from_the_fp32_reference() -> None:
    """hf_fp32 runs once per row, is left out of the band check, and every method's distance from it is
    reported (the noise draws' farthest)."""
    step = bench_step
    args = step.parse(["--models", "gpt_oss", "--shapes", "2x4096", "--methods", f"hf,ours,{step.FP32_REF}"])
    assert [j["repeat"] for j in step.jobs_of(args) if j["method"] == step.FP32_REF] == [0]
    row = {
        "model": "gpt_oss",
        "shape": "2x4096",
        "layers": 4,
        "methods": {
            "hf": {"curves": [[3.0, 2.0], [3.0, 2.1]]},
            step.NOISE: {"curves": [[3.0, 2.05], [3.0, 1.8]]},
            "ours": {"curves": [[3.0, 1.7]]},
            step.FP32_REF: {"curves": [[3.0, 1.75]]},
        },
    }
    step.loss_check(row)
    check = row["loss_check"]
    assert step.FP32_REF not in check["dev"] and check["within"]["ours"] is False
    assert check["fp32_dev"] == pytest.approx({"hf": 0.35, step.NOISE: 0.3, "ours": 0.05})
    lines = step.fp32_lines([row], ["hf", "ours", step.NOISE])
    assert lines[0].startswith(f"distance from {step.FP32_REF}") and "5.00e-02" in lines[-1]
    assert step.fp32_lines([{"loss_check": {"fp32_dev": {}}}], ["hf"]) == []


def test_step_ours_tp_is_opt_in_and_reported_against_liger() -> None:
    """ours_tp (the throughput policy) runs only when asked, and its ratio to liger is in the table."""
    step = bench_step
    default = step.parse(["--models", "llama3_2_1b", "--shapes", "2x4096"])
    assert "ours_tp" not in {j["method"] for j in step.jobs_of(default)}
    args = step.parse(["--models", "llama3_2_1b", "--shapes", "2x4096", "--methods", "liger,ours,ours_tp"])
    assert {j["method"] for j in step.jobs_of(args)} == {"liger", "ours", "ours_tp"}
    row = {
        "model": "llama3_2_1b",
        "shape": "2x4096",
        "layers": 16,
        "methods": {
            m: {"tps": tps, "peak": 17.0}
            for m, tps in (("liger", 100.0), ("ours", 110.0), ("ours_tp", 116.0))
        },
    }
    step.judge(row)
    assert row["ratios"]["tp/liger"] == pytest.approx(1.16)
    head, _, line = step.table_lines([row], ["liger", "ours", "ours_tp"])[:3]
    assert head.split()[-1] == "ours_tp/liger" and line.split()[-1] == "1.160"


def test_moe_cpu_smoke_serves_every_shape(tmp_path: Path, capsys) -> None:
    """moe's CPU smoke: ours against transformers' eager experts at every shape (DBRX: its own loop and 2-D
    per-expert weights), output and every gradient; the flat rows of shape x tokens x method; the table."""
    from liger_registry.kernels.moe import tune_cache

    cache_env = os.environ.get(tune_cache.CACHE_DIR_ENV)
    assert bench_moe.main(["--cpu-smoke", "--methods", "hf:eager,ours", "--out", str(tmp_path)]) == 0
    assert os.environ.get(tune_cache.CACHE_DIR_ENV) == cache_env, "the bench's temporary cache dir is undone"
    data = _json(tmp_path, "bench_moe")
    cases = data["cases"]
    assert {c["shape"] for c in cases} == {"qwen3_moe", "mixtral", "gpt_oss", "dbrx"}
    for case in cases:
        ours = case["methods"]["ours"]
        assert "error" not in ours, (case["shape"], ours.get("error"))
        assert ours["max_rel_diff"] < 1e-5, (case["shape"], ours["rel_diff"])
        assert "d_mlp.v1" in ours["rel_diff"] or case["shape"] != "dbrx"  # the separate up weight's gradient
    rows = {(r["shape"], r["method"]): r for r in data["rows"]}
    assert len(data["rows"]) == 3 * len(cases) and {m for _, m in rows} == {"hf:eager", "ours", "dense"}
    ours, dense, hf = (
        rows[("qwen3_moe", "ours")],
        rows[("qwen3_moe", "dense")],
        rows[("qwen3_moe", "hf:eager")],
    )
    for row in (ours, dense, hf):
        assert {"shape", "tokens", "method", "ms", "peak_mib", "x_dense"} <= set(row)
    assert ours["x_dense"] == pytest.approx(ours["ms"] / dense["ms"])
    assert dense["ours_over"] == pytest.approx(ours["ms"] / dense["ms"])
    assert hf["ours_over"] == pytest.approx(ours["ms"] / hf["ms"]) and ours["ours_over"] == pytest.approx(1.0)
    # CPU tensors run the PyTorch path: nothing to search, and the first calls are timed
    assert ours["autotune_s"] == 0.0 and ours["first_call_s"] > 0 and ours["first_call_cached_s"] > 0
    assert "autotune_s" not in hf
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("shape "))
    assert "ours/this" in header and "tune s" in header and "1st cached s" in header


def test_moe_autotune_picks_name_each_kernel_bucket_and_config(monkeypatch) -> None:
    """bench_moe records the tuners' picks per bucket."""
    from liger_registry.kernels.moe import tuning

    cfg = tuning.TileConfig.of(8, 3, BN=64, BK=64, GROUP_M=8)
    monkeypatch.setitem(tuning.TUNERS["moe_rows"].picks, "N=1536,MODE=0", cfg)
    assert (
        bench_moe.autotune_picks()["moe_rows(N=1536,MODE=0)"]
        == "BK: 64, BN: 64, GROUP_M: 8, warps 8, stages 3"
    )


def test_moe_first_call_of_ours_searches_with_an_empty_cache_then_reads_it(monkeypatch, tmp_path) -> None:
    """Ours' first step: its searches' seconds with an empty cache (``autotune_s``), then the same step as a later
    process makes it (the picks forgotten, the cache file kept: no search); the user's cache dir untouched."""
    import torch

    from liger_registry.kernels.moe import tune_cache, tuning

    monkeypatch.setenv(tune_cache.CACHE_DIR_ENV, str(tmp_path / "user"))
    monkeypatch.setattr(tuning, "time_ms", lambda fn, device: (fn(), 1.0)[1])
    tuner = tuning.TUNERS["moe_rows"]
    cands = [
        tuning.TileConfig.of(4, 1, BN=16, BK=16, GROUP_M=4),
        tuning.TileConfig.of(8, 1, BN=16, BK=16, GROUP_M=4),
    ]
    seen = []

    def fn(module, x, idx, w):
        tuner.pick("bench-test", cands, torch.device("cpu"), lambda cfg: None)
        seen.append((len(tuner.searches), len(tuner.cached)))
        return module(x)

    module = torch.nn.Linear(2, 2)
    inp = {
        "x": torch.randn(3, 2, requires_grad=True),
        "idx": None,
        "w": torch.ones(1),
        "dy": torch.ones(3, 2),
    }
    row, _ = bench_moe.check(fn, module, inp, None, cuda=False, ours=True)
    tuning.reset()
    assert seen == [(1, 0), (0, 1)] and row["autotune_s"] > 0 and row["first_call_cached_s"] > 0
    assert not (tmp_path / "user").exists()


def test_moe_block_rows_method_forces_the_routing_block_and_restores_it() -> None:
    """``ours:bmN`` runs ours with N rows per block (the routing tables built inside have it), then the library's
    choice again; a malformed ``ours:bm`` name is an unknown method."""
    import torch

    from liger_registry.kernels.moe import routing

    moe = bench_moe
    idx = torch.randint(0, 4, (64, 2))
    chosen = routing.route(idx, 4).block_m
    with moe.forced_block_rows(16):
        assert routing.route(idx, 4).block_m == 16
    assert routing.route(idx, 4).block_m == chosen == routing.block_rows(128, 4)
    fns = moe.method_fns(None, "qwen3_moe", ["ours:bm16", "ours:bmx"])
    assert callable(fns["ours:bm16"]) and "unknown method" in str(fns["ours:bmx"])


def test_moe_persistent_method_holds_the_schedule_for_the_whole_step(monkeypatch) -> None:
    """``ours:persistent`` turns the rows kernel's persistent schedule on for its forward and its backward (the
    backward's launches run after the method returns), and off again after the step."""
    import torch

    from liger_registry.kernels.moe import tuning

    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("fwd", tuning.PERSISTENT))
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(("bwd", tuning.PERSISTENT))
            return g * 2

    import liger_registry.modules.moe as moe_module

    # ours' forward replaced by one that reports the schedule it runs under, forward and backward
    monkeypatch.setattr(moe_module, "experts_forward", lambda module, x, idx, w, **kw: Probe.apply(x))
    fn = bench_moe.method_fns(None, "qwen3_moe", ["ours:persistent"])["ours:persistent"]
    x = torch.ones(2, 3, requires_grad=True)
    bench_moe.step(fn, None, {"x": x, "idx": None, "w": None, "dy": torch.ones(2, 3)})
    assert seen == [("fwd", True), ("bwd", True)] and tuning.PERSISTENT is False


def test_llama4_moe_cpu_smoke(tmp_path: Path) -> None:
    """moe --llama4 on tiny dims, fp32: both methods run, ours within fp32 rounding of transformers' block
    (output and every gradient)."""
    assert bench_moe.main(["--llama4", "--cpu-smoke", "--out", str(tmp_path)]) == 0
    rows = {r["method"]: r for r in _json(tmp_path, "bench_moe-llama4")["rows"]}
    assert set(rows) == {"hf", "ours"}
    assert rows["hf"]["rel_diff"] == 0.0 and rows["ours"]["rel_diff"] < 1e-5


def test_ops_cpu_smoke_reports_each_phase_of_every_op(tmp_path: Path) -> None:
    from benchmarks import ops as bench_ops

    assert bench_ops.main(["--cpu-smoke", "--tokens", "32,64", "--repeats", "2", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("bench_ops-smoke_*.json")
    payload = json.loads(path.read_text())
    rows = payload["rows"]
    assert payload["copy_gbs"] > 0 and not payload["errors"]
    assert {(r["op"].split()[0], r["tokens"]) for r in rows} == {
        (op, n)
        for op in ("RMSNorm", "RoPE", "SwiGLU", "GeGLU", "LayerNorm", "CrossEntropy")
        for n in (32, 64)
    }
    for r in rows:
        for method in ("ours", "eager"):
            assert r[f"{method}_ms"] > 0 and r[f"{method}_fwd_ms"] > 0
            assert r[f"{method}_fwd_frac_copy"] > 0


def test_ops_backward_is_the_step_less_the_forward_against_the_copy() -> None:
    from benchmarks import ops as bench_ops

    row = {"bytes_fwd": 2e9, "bytes_bwd": 3e9, "bytes": 5e9, "ours_ms": 3.0, "ours_fwd_ms": 1.0}
    row.update(ours_kernel_ms=2.5, ours_fwd_kernel_ms=1.0, peer_ms=6.0, peer_fwd_ms=7.0)
    bench_ops._ratios(row, copy_gbs=4000.0)
    assert row["ours_bwd_ms"] == pytest.approx(2.0) and row["ours_bwd_kernel_ms"] == pytest.approx(1.5)
    assert row["ours_fwd_gbs"] == pytest.approx(2000.0) and row["ours_fwd_frac_copy"] == pytest.approx(0.5)
    assert row["ours_bwd_kernel_frac_copy"] == pytest.approx(0.5)  # 3e9 B in 1.5 ms = 2000 GB/s
    assert row["ours_vs_peer"] == pytest.approx(0.5) and row["bar_met"]
    assert row["peer_bwd_ms"] is None and "peer_bwd_gbs" not in row  # a step timed below its forward: noise


def test_compile_recipes_by_method_name() -> None:
    module = bench_e2e
    assert module.recipe_of("ours_compile_regional") == ("ours", ("layers", None))
    assert module.recipe_of("hf_compile_autotune") == ("hf", ("model", "max-autotune-no-cudagraphs"))
    assert module.recipe_of("ours_compile_cudagraphs") == ("ours", ("model", "reduce-overhead"))
    assert (
        module.recipe_of("ours_compile") == ("ours", ("model", None))
        and module.recipe_of("ours_tp")[1] is None
    )
    assert not module.is_compiled("ours_tp") and module.is_compiled("hf_compile_regional")
    assert set(module.OPT_IN) <= set(bench_step.OPT_IN)
    with pytest.raises(SystemExit):
        module.parse(["--methods", "ours_compile_fast"])
    tps = {
        "ours": 100.0,
        "hf_compile_regional": 80.0,
        "ours_compile_regional": 96.0,
        "ours_compile_autotune": 90.0,
    }
    ratios = module.recipe_ratios(tps)
    assert ratios["ours_compile_regional/hf_compile_regional"] == 96.0 / 80.0
    assert (
        ratios["ours_compile_autotune/ours"] == 0.9
        and ratios["ours_compile_autotune/hf_compile_autotune"] is None
    )


def test_regional_recipe_compiles_each_decoder_layer_and_leaves_the_rest(monkeypatch) -> None:
    """`_compile_regional` compiles every decoder layer's module in place (what transformers and torchtitan
    recommend) and returns the model itself; the other recipes wrap the whole model with the recipe's mode, which
    a backend other than inductor is not given."""
    import torch

    job = {"model": "llama", "layers": 2, "smoke": True, "dtype": torch.float32}
    model, _ = bench_e2e.build_model(job, "cpu")
    compiled = []
    monkeypatch.setattr(
        torch.nn.Module, "compile", lambda self, **kw: compiled.append((type(self).__name__, kw))
    )
    assert bench_e2e.compile_model(model, "ours_compile_regional", "inductor") is model
    assert compiled == [("LlamaDecoderLayer", {"backend": "inductor"})] * 2
    wrapped = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: wrapped.append((m, kw)) or m)
    bench_e2e.compile_model(model, "hf_compile_cudagraphs", "inductor")
    bench_e2e.compile_model(model, "hf_compile_autotune", "aot_eager")
    assert wrapped == [
        (model, {"backend": "inductor", "mode": "reduce-overhead"}),
        (model, {"backend": "aot_eager"}),
    ]
    # bench_step's --compile layers makes the plain recipe regional
    compiled.clear()
    assert bench_step.compile_model(model, {"method": "hf_compile", "compile": "layers"}) is model
    assert len(compiled) == 2


def test_e2e_cpu_smoke_runs_the_compile_recipes(tmp_path: Path) -> None:
    # one recipe: the mode-passing recipes are covered by test_compile_recipes_by_method_name
    args = ["--cpu-smoke", "--models", "llama", "--layers", "2", "--repeats", "1", "--methods"]
    _run("e2e", *args, "ours_compile_regional", "--compile-backend", "aot_eager", "--out", str(tmp_path))
    data = _json(tmp_path, "bench_e2e")
    runs = {r["method"]: r for r in data["runs"]}
    for r in runs.values():
        assert r["ok"], r.get("error")
        assert r["first_step_s"] > 0 and r["compile_s"] >= 0 and all(math.isfinite(x) for x in r["losses"])
    (row,) = data["rows"]
    assert set(row["recipes"]) == {"ours_compile_regional/hf_compile_regional", "ours_compile_regional/ours"}


def test_step_recipes_are_compiled_methods_with_their_repeats_and_time() -> None:
    args = bench_step.parse(
        ["--models", "llama3_2_1b", "--shapes", "2x4096", "--methods", "ours,ours_compile_regional"]
        + ["--repeats", "2", "--compile-repeats", "1", "--no-noise", "--compile-backend", "aot_eager"]
    )
    jobs = bench_step.jobs_of(args)
    regional = [j for j in jobs if j["method"] == "ours_compile_regional"]
    assert len(regional) == 1 and len([j for j in jobs if j["method"] == "ours"]) == 2
    assert regional[0]["timeout_s"] == 2 * args.timeout_s and regional[0]["compile_backend"] == "aot_eager"
