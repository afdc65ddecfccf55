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
    assert (
        out.splitlines()[-1]
        == f"{len(registry.families)} families, {len(registry.by_model_type)} model types"
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
    assert cli.main(["show", "lama"]) == 1
    assert "Did you mean 'llama'" in capsys.readouterr().err
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
    assert cli.main(["show", "mllama_txt_model"]) == 1
    assert "Did you mean 'mllama_text_model'" in capsys.readouterr().err


MINE = (
    "family: mine\nmodel_types: [mine]\nmodule: transformers.models.llama.modeling_llama\n"
    "causal_lm: LlamaForCausalLM\nforward: causal_lm\nflce: {chunk_mem_const: 3}\n"
)


def test_explain_and_show_read_registry_directories(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text(MINE)
    assert cli.main(["explain", "mine"]) == 1
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

    from liger_registry.kernels.op import OPS

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
    assert located == {("broken.yaml", 3), ("typo.yaml", 6)}
    assert any("not valid YAML" in f["message"] for f in findings)


def test_lint_json_points_a_forward_finding_at_its_source():
    from liger_registry.lint import lint_forward

    def kwargs_only(self, input_ids=None, **kwargs):
        return None

    (finding,) = lint_forward(kwargs_only)
    assert finding.file == __file__
    assert finding.line == inspect.getsourcelines(kwargs_only)[1]
