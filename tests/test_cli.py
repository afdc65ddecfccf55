"""The liger-registry command: exit codes, tables, JSON schema, help, pipes, the env report."""

import argparse
import inspect
import io
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import liger_registry
from liger_registry import cli
from liger_registry.console import rich_table

ROOT = Path(__file__).resolve().parents[1]


def test_list_prints_every_family(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for family in ("llama", "mistral", "qwen2", "qwen3", "gpt_oss"):
        assert family in out
    assert "transformers tested" in out
    registry = liger_registry.load_registry()
    header, *rows = out.splitlines()[:-1]
    at = header.index("off")  # the column's start; its cells are "-" or the kernels that are off
    off = [row.split()[0] for row in rows[1:] if not row[at:].startswith("- ")]
    assert "bitnet" in off and "llama" not in off and "mixtral" not in off
    assert out.splitlines()[-1] == (
        f"{len(registry.families)} families, {len(registry.by_model_type)} model types, "
        f"{len(registry.families) - len(off)} families with every kernel on"
    )


def test_the_readme_states_the_bundled_family_count():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"The bundled registry has {len(liger_registry.load_registry().families)} families." in readme


def test_show_and_explain(capsys):
    assert cli.main(["show", "gpt_oss"]) == 0
    assert "clamped SwiGLU" in capsys.readouterr().out
    assert cli.main(["explain", "gpt_oss"]) == 0
    out = capsys.readouterr().out
    assert "flce.chunk_mem_const" in out and "bundled policy gpt_oss" in out


def test_explain_with_user_policy(tmp_path, capsys):
    policy = tmp_path / "p.yaml"
    policy.write_text("policy: mine\napplies_to: [llama]\nreason: r\nflce: {chunk_mem_const: 2}\n")
    assert cli.main(["explain", "llama", "--policy", str(policy)]) == 0
    assert "user policy mine" in capsys.readouterr().out


def test_schema_is_json_schema(capsys):
    assert cli.main(["schema"]) == 0
    schemas = json.loads(capsys.readouterr().out)
    assert (
        "skip_logits" in schemas["family"]["properties"] and "applies_to" in schemas["policy"]["properties"]
    )


def test_unknown_family_and_usage_errors(capsys):
    assert cli.main(["show", "lama"]) == 2
    assert "did you mean 'llama'" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2
    assert cli.main(["lint", "--format", "xml"]) == 2


def test_demo_runs_and_losses_match(capsys):
    from liger_registry.demo import run_demo

    baseline, patched = run_demo(steps=2)
    assert len(baseline) == 2 and all(abs(a - b) < 1e-4 for a, b in zip(baseline, patched, strict=True))
    assert "fused_linear_cross_entropy" in capsys.readouterr().out


def _arguments(parser: argparse.ArgumentParser):
    """Every (command, action) of the parser and its subcommands, but the -h that argparse adds itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from ((f"command {c.dest}", c) for c in action._choices_actions)
            for name, sub in action.choices.items():
                yield from ((f"{name} {a.dest}", a) for a in sub._actions if a.dest != "help")
        elif action.dest != "help":
            yield action.dest, action


def test_every_argument_has_help():
    arguments = list(_arguments(cli._parser()))
    assert len(arguments) > 20  # the walk reached the subcommands
    assert [name for name, action in arguments if not action.help or action.help == argparse.SUPPRESS] == []


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"liger-registry {liger_registry.__version__}"


def _run(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "liger_registry.cli", *args], env=env, **popen)


@pytest.mark.parametrize("command", [["schema"], ["list"]])
def test_a_reader_that_closes_early_gets_no_traceback(command):
    """`liger-registry list | head -1`: here the reader has gone before the command writes anything (a real
    `| head` races with a short output; this does not)."""
    proc = _run(*command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child has imported anything, so its first write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.BROKEN_PIPE
    assert err == ""


def test_rich_tables_fold_long_names_instead_of_cutting_them():
    name = "qwen3_vl_moe_text_with_a_name_much_longer_than_the_terminal_is_wide"
    out = io.StringIO()
    Console(file=out, width=40).print(rich_table(["family", "kernels"], [[name, "rms_norm, rope"]]))
    lines = out.getvalue().splitlines()
    first_column = [line.split("│")[1].strip() for line in lines if line.count("│") == 3]
    assert "…" not in out.getvalue() and "".join(first_column) == name
    assert len(first_column) > 1  # it did fold


def test_show_takes_a_model_type_like_explain(capsys):
    assert cli.main(["show", "mllama_text_model"]) == 0  # a model type of the family mllama_text
    out = capsys.readouterr().out
    assert "mllama_text.yaml (serves model type mllama_text_model)" in out
    assert yaml.safe_load(out)["family"] == "mllama_text"
    assert cli.main(["show", "mllama_txt_model"]) == 2
    assert "did you mean 'mllama_text_model'" in capsys.readouterr().err


MINE = (
    "family: mine\nmodel_types: [mine]\nmodule: transformers.models.llama.modeling_llama\n"
    "causal_lm: LlamaForCausalLM\nforward: causal_lm\nflce: {chunk_mem_const: 3}\n"
)


def test_explain_and_show_read_registry_directories(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text(MINE)
    assert cli.main(["explain", "mine"]) == 2
    assert "no liger_registry family serves model_type 'mine'" in capsys.readouterr().err
    assert cli.main(["explain", "mine", "--registry", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "family mine (mine.yaml)" in out
    assert (
        next(line for line in out.splitlines() if line.startswith("flce.chunk_mem_const")).split()[1] == "3"
    )
    assert cli.main(["show", "mine", "--registry", str(tmp_path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["flce"]["chunk_mem_const"] == 3


def test_demo_rejects_zero_steps(capsys):
    assert cli.main(["demo", "--steps", "0"]) == 2
    assert "--steps: must be at least 1, got 0" in capsys.readouterr().err
    assert cli.main(["demo", "--steps", "two"]) == 2
    assert "must be a whole number, got 'two'" in capsys.readouterr().err


def test_env_reports_versions_and_the_backend_of_every_op(capsys, monkeypatch):
    import torch
    import transformers

    from liger_registry.kernels.backend import OPS

    monkeypatch.delenv("LIGER_REGISTRY_BACKEND", raising=False)
    assert cli.main(["env", "--format", "json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["packages"]["transformers"] == transformers.__version__
    assert report["packages"]["torch"].startswith(torch.__version__)
    assert {"triton", "pydantic"} <= set(report["packages"]) and report["python"] == platform.python_version()
    assert set(report["backends"]) == set(OPS)
    assert {c["backend"] for c in report["backends"].values()} == {"torch"}  # auto on CPU
    assert report["variables"]["LIGER_REGISTRY_BACKEND"] is None
    monkeypatch.setenv("LIGER_REGISTRY_BACKEND", "torch")
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert "LIGER_REGISTRY_BACKEND=torch" in out and "gpus: " in out
    rows = [
        line.split() for line in out.splitlines()[out.splitlines().index("backends on cpu / float32:") + 3 :]
    ]
    assert {row[0] for row in rows} == set(OPS) and all(
        row[1:] == ["torch", "LIGER_REGISTRY_BACKEND=torch"] for row in rows
    )


def test_lint_json_gives_file_and_line_of_each_problem(tmp_path, capsys):
    bad_target = MINE.replace(
        "flce: {chunk_mem_const: 3}", "kernels:\n  rms_norm: {targets: [LlamaRMSNormX]}"
    )
    (tmp_path / "mine.yaml").write_text(bad_target)
    assert cli.main(["lint", "--registry", str(tmp_path), "--format", "json"]) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["check"] == "targets" and "LlamaRMSNormX" in finding["message"]
    assert (finding["file"], finding["line"]) == (str(tmp_path / "mine.yaml"), 7)


def test_yaml_syntax_and_schema_errors_name_the_file_and_line(tmp_path, capsys):
    (tmp_path / "broken.yaml").write_text("family: broken\nmodel_types: [broken\n  - x: y\n")
    (tmp_path / "typo.yaml").write_text(MINE.replace("flce:", "flec:"))
    assert cli.main(["lint", "--registry", str(tmp_path), "--format", "json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    located = {(Path(f["file"]).name, f["line"]) for f in findings}
    # the bracket opened on line 2 and never closed; the fields that are missing beside it, on the mapping's line
    assert located == {("broken.yaml", 2), ("broken.yaml", 1), ("typo.yaml", 6)}
    assert any("not valid YAML" in f["message"] for f in findings)
    assert any("module: Field required" in f["message"] for f in findings)


def test_lint_json_points_a_forward_finding_at_its_source():
    from liger_registry.lint import lint_forward

    def kwargs_only(self, input_ids=None, **kwargs):
        return None

    (finding,) = lint_forward(kwargs_only)
    assert finding.file == __file__
    assert finding.line == inspect.getsourcelines(kwargs_only)[1]


def _usage_error(capsys, argv: list[str]) -> str:
    """The one line a usage error prints (exit 2, no traceback)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
        (["--device", "tpu"], "argument --device: 'tpu' is not a torch device"),
        (
            ["--tokens", "8", "--gpu", "RTX9999"],
            "argument --gpu: unknown GPU 'RTX9999'; known: H200, H100, A100",
        ),
        (["--tokens", "8", "--hidden", "0"], "argument --hidden: must be at least 1, got 0"),
        (["--tokens", "8", "--vocab", "0"], "argument --vocab: must be at least 1, got 0"),
        (["--tokens", "-5"], "argument --tokens: must be at least 1, got -5"),
    ],
)
def test_explain_bad_options_are_usage_errors(capsys, argv, says):
    assert says in _usage_error(capsys, ["explain", "llama", *argv])


def test_explain_gpu_names_match_the_cost_table(capsys):
    for name in ("h200", "NVIDIA H200"):
        assert cli.main(["explain", "llama", "--tokens", "8192", "--gpu", name]) == 0
        assert "on H200" in capsys.readouterr().out


def test_explain_api_refuses_an_unknown_gpu_and_a_zero_size():
    with pytest.raises(ValueError, match="unknown GPU 'RTX9999'; known: H200, H100, A100"):
        str(liger_registry.explain("llama", tokens=8, gpu="RTX9999"))
    with pytest.raises(ValueError, match="hidden"):
        str(liger_registry.explain("llama", tokens=8, hidden=0))
    with pytest.raises(ValueError, match="float8"):
        str(liger_registry.explain("llama", device="cpu", dtype="float8"))


@pytest.mark.parametrize(
    "argv",
    [
        ["gpt2", "--report"],
        ["gpt2", "--cap", "5"],
        ["--all", "--write", "out"],
        ["--all", "--family", "mine"],
    ],
)
def test_scaffold_options_of_the_other_mode_are_usage_errors(capsys, monkeypatch, argv):
    from liger_registry.scaffold import cli as scaffold_cli

    def never(*args, **kwargs):
        raise AssertionError("ran the scaffold")

    monkeypatch.setattr(scaffold_cli, "scaffold", never)
    monkeypatch.setattr(scaffold_cli, "scaffold_all", never)
    line = _usage_error(capsys, ["scaffold", *argv])
    assert "--all" in line


def test_scaffold_refuses_to_write_a_model_type_the_registry_serves(capsys, monkeypatch, tmp_path):
    from liger_registry.scaffold import cli as scaffold_cli

    monkeypatch.setattr(scaffold_cli, "scaffold", lambda *a, **k: pytest.fail("ran the scaffold"))
    line = _usage_error(capsys, ["scaffold", "llama", "--write", str(tmp_path)])
    bundled = liger_registry.load_registry().family_for("llama").path
    assert f"model type 'llama' is already served by family 'llama' ({bundled})" in line
    assert list(tmp_path.iterdir()) == []
    line = _usage_error(capsys, ["scaffold", "gpt2", "--family", "llama", "--write", str(tmp_path)])
    assert f"family 'llama' is already defined in {bundled}" in line


def test_env_cuda_without_a_gpu_is_a_usage_error(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for device in ("cuda", "cuda:1"):
        assert f"argument --device: no CUDA device here ({device})" in _usage_error(
            capsys, ["env", "--device", device]
        )
    assert "'tpu' is not a torch device" in _usage_error(capsys, ["env", "--device", "tpu"])


def test_show_an_unknown_family_suggests_and_points_to_list(capsys):
    line = _usage_error(capsys, ["show", "lama"])
    assert "unknown family 'lama'; did you mean 'llama'?" in line
    assert "liger-registry list" in line and "model_type" not in line


def test_usage_errors_of_argparse_are_one_line(capsys):
    line = _usage_error(capsys, ["demo", "--steps", "0"])
    assert line == "liger-registry demo: error: argument --steps: must be at least 1, got 0 (see --help)"


def test_explain_without_a_gpu_names_the_gpu_its_time_assumes(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["explain", "llama", "--tokens", "8192"]) == 0
    plan = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("FLCE plan"))
    assert " on default" not in plan
    assumed = (
        "a generic GPU (300 TFLOP/s, 2.0 TB/s; no CUDA device here; gpu=/--gpu names one: H200, H100, A100)"
    )
    assert f" ms on {assumed} (" in plan


@pytest.mark.parametrize(
    "argv, says",
    [
        (["explain", "lama"], "no liger_registry family serves model_type 'lama'. Did you mean 'llama'?"),
        (
            ["lint", "--family", "lama"],
            "no liger_registry family serves model_type 'lama'. Did you mean 'llama'?",
        ),
        (["explain", "llama", "--policy", "nosuch"], "no policy file or registry policy named 'nosuch'"),
    ],
)
def test_every_unknown_name_on_the_command_line_is_a_usage_error(capsys, argv, says):
    line = _usage_error(capsys, argv)
    assert line.startswith(f"liger-registry {argv[0]}: error: ") and says in line
