"""`kspec bench step` on a small random model: every case incl. the cold prefill, per path."""

from __future__ import annotations

import pytest

from model_factory import write_random_model
from kspec.bench.step import bench_step, path_config
from kspec.engine.config import EngineConfig


def test_paths_pin_dtype_and_the_fast_paths_settings() -> None:
    config = EngineConfig(progress=False)
    assert path_config(config, "float32").dtype == "float32"
    assert (path_config(config, "auto/4bit").dtype, path_config(config, "auto/4bit").cpu_weights) == ("auto", "4bit")
    assert path_config(config, "auto/4bit+dense").cpu_weights == "4bit+dense"
    assert (path_config(config, "auto/torch").cpu_kernels, path_config(config, "auto/torch").cpu_weights) == ("torch", "auto")
    assert (path_config(config, "auto/4bit/torch").cpu_kernels, path_config(config, "auto/4bit/torch").cpu_weights) == ("torch", "4bit")
    pinned = path_config(config, "auto/4bit/int4=kspec")
    assert (pinned.cpu_weights, pinned.cpu_kernels, pinned.cpu_int4) == ("4bit", "auto", "kspec")
    assert path_config(config, "auto/int4=torch").cpu_int4 == "torch"
    pinned = path_config(config, "auto/4bit/kv=float32")
    assert (pinned.cpu_weights, pinned.cpu_kv, path_config(config, "auto").cpu_kv) == ("4bit", "float32", "auto")
    with pytest.raises(ValueError, match="cpu_kv"):
        path_config(config, "auto/kv=int8")
    with pytest.raises(ValueError, match="cpu_weights"):
        path_config(config, "auto/int8")
    with pytest.raises(ValueError, match="at most one"):
        path_config(config, "auto/4bit/4bit+dense")


def test_step_report_has_every_case_for_every_path(tmp_path) -> None:
    model = write_random_model(tmp_path / "m")
    report = bench_step(EngineConfig(model=str(model), progress=False), ks=[1, 2], paths=["float32", "auto/4bit"], prompt_tokens=48, repeats=1)
    cases = [row["case"] for row in report["cases"]]
    verify = f"verify 2x{EngineConfig().gamma + 1}"
    assert cases == ["k=1", "k=2", verify, f"{verify}, drafts rejected", f"cold prefill {report['prompt_tokens']}"]
    for row in report["cases"]:
        assert set(row["ms"]) == {"float32", "auto/4bit"} and all(ms > 0 for ms in row["ms"].values())
        assert row["speedup"]["float32"] == 1.0
    assert set(report["resident_weights_mb"]) == {"float32", "auto/4bit"}
