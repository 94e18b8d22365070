"""scripts/gpu_check.py --smoke: every section of the device check runs here on tiny shapes (the
device run itself needs a GPU; see the README)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_smoke_run_prints_one_json_with_every_section(gpu_check, capsys, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    status = gpu_check.main(["--smoke", "--out", str(out)])
    printed = capsys.readouterr().out
    report = json.loads(printed)  # one JSON object, nothing else on stdout
    assert report == json.loads(out.read_text())
    assert report["failed"] == [], report["failed"]
    assert status == 0
    for section in ("environment", "bandwidth", "kernels", "model", "decode", "bifurcated_vs_replicated", "bass", "cuda_graph"):
        assert section in report, section
        assert "error" not in report[section], report[section]
    assert report["environment"]["attention_paths"]["decode"] in ("cpu-fused", "pytorch")
    assert report["bandwidth"]["bytes_per_s"] > 0
    kernels = report["kernels"]
    assert {row["path"] for row in kernels["checked"]} == {"dispatch"}  # on CPU: the engine's own path vs the reference
    assert all(row["ok"] for row in kernels["checked"])
    assert set(kernels["not_checked"]) == {"flash-attn", "triton"} or report["environment"]["flash_attn"]
    assert len(report["decode"]) == 2 * 3  # contexts x ks
    assert all(row["step_ms"] > 0 and row["floor_ms"] > 0 for row in report["decode"])
    replicated = report["bifurcated_vs_replicated"]
    assert [row["k"] for row in replicated] == [2, 4]
    assert replicated[-1]["replicated_kv_storage"].startswith("one layer")  # the shared-buffer path ran too
    bass = report["bass"]
    assert [row["gamma"] for row in bass["by_gamma"]] == [1, 2]
    assert all(row["round_ms"] > 0 for row in bass["by_gamma"])
    assert set(bass["best_gamma_by_acceptance"]) == {"0.5", "0.8"}
    assert report["cuda_graph"] == {"skipped": "CUDA graphs need a GPU"}


def test_without_cuda_and_without_smoke_it_says_so(gpu_check, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the full run would start")
    assert gpu_check.main([]) == 0
    assert "skipped" in json.loads(capsys.readouterr().out)


def test_draft_shape_is_the_target_scaled_down(gpu_check) -> None:
    target, draft = gpu_check.model_args("llama2-7b"), gpu_check.model_args("llama2-7b", gpu_check.DRAFT_SCALE)
    assert (draft.head_dim, draft.vocab_size) == (target.head_dim, target.vocab_size)
    assert draft.dim == target.dim // 4 and draft.n_layers == target.n_layers // 4
    qwen = gpu_check.model_args("qwen2-7b", gpu_check.DRAFT_SCALE)
    assert qwen.n_heads % qwen.n_kv_heads == 0 and qwen.head_dim == 128
