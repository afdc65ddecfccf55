"""The liger-registry command: exit codes, tables, JSON schema."""

import json

from liger_registry import cli


def test_list_prints_every_family(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for family in ("llama", "mistral", "qwen2", "qwen3", "gpt_oss"):
        assert family in out
    assert "transformers tested" in out


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
