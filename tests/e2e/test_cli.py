"""The `kspec` command as a user runs it: output contract and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from suite_models import real_default_env

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.py"


def kspec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kspec.cli.main", *args], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)


@pytest.mark.slow
def test_complete_json_with_the_real_default_model():
    """The README's main job as a user runs it: no model named, so the real default writes code."""
    run = kspec("complete", f"{DEMO}:16:5", "-k", "2", "--max-tokens", "32", "--json", env=real_default_env())
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert set(result) >= {"completions", "timing_ms", "model"}
    assert result["model"].startswith("qwen2.5-coder-0.5b (Qwen2.5-Coder-0.5B-Instruct")
    assert any("prime" in c["text"] for c in result["completions"]), result["completions"]  # the example's own helper and names
    assert result["attention"]["prefill"] == "sdpa" and result["attention"]["decode"] in ("cpu-fused", "pytorch")  # kernels/paths.py
    assert 1 <= len(result["completions"]) <= 2
    assert all(isinstance(c["text"], str) and c["text"].strip() and isinstance(c["score"], float) for c in result["completions"])


def test_eval_writes_results_in_case_order(tmp_path: Path, random_llama_dir: Path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        "\n".join(
            json.dumps({"id": f"c{i}", "prefix": f"def f{i}(x):\n    return ", "suffix": "\n", "language": "python", "reference": "x", "tag": i})
            for i in range(3)
        )
    )
    out = tmp_path / "results.jsonl"
    run = kspec("eval", str(cases), "--out", str(out), "-k", "2", "--max-tokens", "4", "--model", str(random_llama_dir))
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["c0", "c1", "c2"]
    assert [line["tag"] for line in lines] == [0, 1, 2]  # extra fields carried through
    assert all("completions" in line and line["latency_ms"] > 0 for line in lines)
    summary = json.loads(run.stdout)
    assert summary["cases"] == 3 and summary["cases_with_reference"] == 3
    if summary["suggestions_shown"]:
        assert 0.0 <= summary["shown_breaking_parse"] <= 1.0
    else:  # a random model's text may all be dropped by post-processing: then no rate is claimed
        assert summary["shown_breaking_parse"] is None


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [  # 1: a runtime error; 2: a usage error (as argparse's own)
        (("complete", "no/such/file.py:1:1"), "no such file", 1),
        (("complete", f"{DEMO}:999:1"), "line 999 is outside the file", 1),
        (("complete", f"{DEMO}:1:99"), "column 99 is outside the line", 1),
        (("complete", f"{DEMO}"), "expected PATH:LINE:COL", 2),
        (("complete", f"{DEMO}:1:1", "--model", "no/such/model.gguf"), "does not exist", 1),
        (("complete", f"{DEMO}:1:1", "-k", "0"), "k must be between", 2),
        (("eval", "no/such/cases.jsonl", "--out", "/dev/null"), "no such file", 1),
    ],
)
def test_errors_are_one_clear_line(args: tuple[str, ...], message: str, code: int):
    run = kspec(*args)
    assert run.returncode == code
    assert message in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_unreadable_gguf_is_one_clear_line(tmp_path: Path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x00" * 1000)
    run = kspec("complete", f"{DEMO}:1:1", "--model", str(bad))
    assert run.returncode == 1 and "GGUF" in run.stderr and "Traceback" not in run.stderr
