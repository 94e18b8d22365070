"""The CPU fast path's kernels chosen by measurement (engine/models/kernel_choice.py): the rule on
given times, the cache by what a choice depends on, the trial on a real model's codes, and
`$KSPEC_CPU`, which caps what the engine believes the CPU has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kspec.engine.config import EngineConfig
from kspec.engine.machine_fit import BUSY_MAX_AGE_S
from kspec.engine.models import cpu_fast, kernel_choice
from kspec.engine.models.cpu_fast import FastPath, measured_path
from kspec.engine.models.cpu_profile import CpuFacts
from kspec.engine.models.kernel_choice import ChoiceCache, crossover, decide
from kspec.engine.models.quantized import Q4File, int4_kernel_available
from kspec.engine.models.resolve import codes_file, resolve_model

DENSE = "dense bfloat16"


def _times(kspec: tuple[float, ...], torch_: tuple[float, ...], dense: tuple[float, ...]) -> dict[str, dict[int, float]]:
    rows = kernel_choice.TRIAL_ROWS
    return {"kspec": dict(zip(rows, kspec)), "torch": dict(zip(rows, torch_)), DENSE: dict(zip(rows, dense))}


def test_the_faster_kernel_over_a_round_wins_and_the_prior_keeps_a_near_tie():
    times = _times((1.0, 2.0, 6.0, 20.0), (1.5, 2.5, 6.0, 14.0), (3.0, 3.0, 7.0, 9.0))
    assert decide(times, ["kspec", "torch"], DENSE, "torch", True).int4_kernel == "kspec"  # 9 vs 10 ms: beyond the tie
    near = _times((1.0, 2.0, 6.0, 20.0), (1.0, 2.0, 6.2, 14.0), (3.0, 3.0, 7.0, 9.0))
    assert decide(near, ["kspec", "torch"], DENSE, "torch", True).int4_kernel == "torch"  # 9.2 vs 9: within 3 %, the prior stays
    assert decide(near, ["kspec", "torch"], DENSE, "kspec", True).int4_kernel == "kspec"


def test_a_dense_copy_is_kept_only_where_verification_pays_and_there_is_room():
    cold_prefill_only = _times((1.0, 2.0, 6.0, 20.0), (9.0, 9.0, 9.0, 90.0), (3.0, 3.0, 6.5, 9.0))
    choice = decide(cold_prefill_only, ["kspec", "torch"], DENSE, None, True)
    assert not choice.keep_dense and "does not pay" in choice.why  # 2.2x at 64 rows, 0.92x at 20
    pays = _times((1.0, 2.0, 12.0, 40.0), (9.0, 9.0, 90.0, 90.0), (3.0, 3.0, 6.0, 9.0))
    assert decide(pays, ["kspec"], DENSE, None, True).keep_dense
    no_room = decide(pays, ["kspec"], DENSE, None, False)
    assert not no_room.keep_dense and "no room" in no_room.why
    assert not decide(pays, ["kspec"], None, None, True).keep_dense  # no dense candidate measured


def test_a_dense_copy_is_not_kept_where_its_rows_would_leave_the_layer_loop():
    pays = _times((1.0, 2.0, 12.0, 40.0), (9.0, 9.0, 90.0, 90.0), (3.0, 3.0, 6.0, 9.0))  # 2x at 20 rows' projections
    looped = decide(pays, ["kspec", "torch"], DENSE, None, True, layer_loop=True)
    assert looped.int4_kernel == "kspec" and not looped.keep_dense and "layer loop" in looped.why
    assert looped.int4_max_rows == max(kernel_choice.TRIAL_ROWS)  # every row count on the 4-bit kernel
    slow_kspec = _times((9.0, 9.0, 90.0, 90.0), (1.0, 2.0, 12.0, 40.0), (3.0, 3.0, 6.0, 9.0))
    assert decide(slow_kspec, ["kspec", "torch"], DENSE, None, True, layer_loop=True).keep_dense  # PyTorch's kernel: no loop to leave


def test_the_crossover_lies_between_the_measured_row_counts():
    assert crossover({1: 1.0, 4: 2.0, 20: 6.0, 64: 20.0}, {1: 3.0, 4: 3.0, 20: 7.0, 64: 9.0}) == 23  # 1 ms ahead at 20, 11 behind at 64: 20 + 44 / 12
    assert crossover({1: 1.0, 4: 2.0}, {1: 3.0, 4: 3.0}) == 4  # the kernel wins everywhere measured
    assert crossover({1: 4.0, 4: 8.0}, {1: 3.0, 4: 3.0}) == 1  # never below one row


def test_a_choice_survives_its_cache_and_a_bad_entry_is_a_miss(tmp_path: Path):
    choice = decide(_times((1.0, 2.0, 6.0, 20.0), (1.5, 2.5, 6.0, 14.0), (3.0, 3.0, 4.0, 9.0)), ["kspec", "torch"], DENSE, None, True)
    cache = ChoiceCache(tmp_path / "choice.json")
    cache.put("a", choice)
    assert ChoiceCache(tmp_path / "choice.json").get("a") == choice and cache.get("b") is None
    stored = json.loads((tmp_path / "choice.json").read_text())["a"]
    for wrong in ({"int4_kernel": "cuda"}, {"keep_dense": 1}, {"times_ms": {"torch": {"four": 1.0}}}):
        (tmp_path / "choice.json").write_text(json.dumps({"a": {**stored, "value": {**stored["value"], **wrong}}}))
        assert cache.get("a") is None, wrong
    (tmp_path / "choice.json").write_text(json.dumps({"a": stored}))
    assert cache.get("a") == choice


@pytest.mark.skipif(not int4_kernel_available(), reason="this PyTorch has no int4 CPU kernel")
def test_the_trial_times_a_real_models_layer_once_and_later_starts_take_the_cache(small_gguf, tmp_path: Path, monkeypatch):
    folder = resolve_model(str(small_gguf), progress=False).folder
    calls = []
    real_measure = cpu_fast.measure
    monkeypatch.setattr(cpu_fast, "measure", lambda *args: calls.append(1) or (real_measure(*args)[0], 1.0))  # as on a quiet machine
    cache = ChoiceCache(tmp_path / "choice.json")
    with Q4File(codes_file(folder)) as codes:
        path, choice = measured_path(codes, FastPath(), cache, "key")
        assert choice is not None and calls == [1]
        names = set(choice.times_ms)
        assert {"torch"} <= names and all(set(t) == set(kernel_choice.TRIAL_ROWS) and min(t.values()) > 0 for t in choice.times_ms.values())
        assert path.int4_kernel == choice.int4_kernel and path.keep_dense == choice.keep_dense
        again, cached = measured_path(codes, FastPath(), cache, "key")
        assert (again, cached) == (path, choice) and calls == [1]  # the second start measured nothing
        forced = FastPath(int4_kernel="torch", keep_dense=False)
        assert measured_path(codes, forced, cache, "other") == (forced, None) and calls == [1]  # the settings decide
        one_kernel, mine = measured_path(codes, FastPath(int4_kernel="torch"), None, "")
        assert set(mine.times_ms) - {kernel_choice.dense_name(FastPath().resolved_dense_dtype())} == {"torch"}
        assert one_kernel.int4_kernel == "torch"


def test_a_loaded_model_says_its_kernels_were_measured_here(small_gguf, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path / "cache"))
    from kspec.engine.models.loading import load_model

    loaded = load_model(str(small_gguf), EngineConfig(progress=False, fit_to_machine=False))
    if "int4" not in loaded.compute:
        pytest.skip(f"no CPU fast path here: {loaded.compute}")
    assert "measured here" in loaded.compute and loaded.model.kernel_choice is not None
    assert (tmp_path / "cache" / kernel_choice.CHOICE_CACHE_FILE).is_file() == loaded.model.kernel_choice.quiet


def test_kspec_cpu_caps_what_the_engine_believes_the_cpu_has(monkeypatch):
    monkeypatch.setenv("KSPEC_CPU", "avx2")
    monkeypatch.setattr("kspec.kernels.cpu_layers.matmul_isa", lambda cache_dir: "avx2")
    facts = CpuFacts.here()
    assert (facts.capability, facts.amx, facts.native_bf16) in {("AVX2", False, False), ("DEFAULT", False, False)}
    monkeypatch.setenv("KSPEC_CPU", "avx9")
    with pytest.raises(ValueError, match="KSPEC_CPU must be one of native, avx2"):
        CpuFacts.here()


def test_the_kspec_command_holds_pytorch_to_kspec_cpu():
    code = "import kspec.cli, torch, os; print(torch.backends.cpu.get_cpu_capability(), os.environ['ONEDNN_MAX_CPU_ISA'])"
    env = {**os.environ, "KSPEC_CPU": "avx2"}
    env.pop("ATEN_CPU_CAPABILITY", None)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    native = torch.backends.cpu.get_cpu_capability()
    assert out == [native if native in ("AVX2", "DEFAULT") else "AVX2", "AVX2"]


@pytest.mark.skipif(not int4_kernel_available(), reason="this PyTorch has no int4 CPU kernel")
def test_a_choice_measured_while_other_work_competed_is_reused_for_an_hour_only(small_gguf, tmp_path: Path, monkeypatch):
    folder = resolve_model(str(small_gguf), progress=False).folder
    real_measure = cpu_fast.measure
    shares = [0.4, 1.0]
    monkeypatch.setattr(cpu_fast, "measure", lambda *args: (real_measure(*args)[0], shares.pop(0)))
    cache = ChoiceCache(tmp_path / "choice.json")
    with Q4File(codes_file(folder)) as codes:
        busy = measured_path(codes, FastPath(), cache, "key")[1]
        assert busy is not None and not busy.quiet and "measured again after 1 h" in busy.why and cache.get("key") == busy
        assert cache.get("key", now=time.time() + BUSY_MAX_AGE_S + 1) is None  # then a start measures again
        entries = json.loads(cache.path.read_text())
        cache.path.write_text(json.dumps({key: {**entry, "at": entry["at"] - BUSY_MAX_AGE_S - 1} for key, entry in entries.items()}))
        quiet = measured_path(codes, FastPath(), cache, "key")[1]
        assert quiet is not None and quiet.quiet and cache.get("key") == quiet and not shares
