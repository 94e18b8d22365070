"""One namespace when installed: everything under `kspec.`, nothing named `engine` or
`kernels` in site-packages (Hugging Face's `transformers` probes for a `kernels` package)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_only_the_kspec_namespace(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building leaves a build/ folder behind
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "node_modules", "build", "__pycache__", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", str(source), "-w", str(tmp_path)],
        check=True, capture_output=True, cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("kspec-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"kspec"}
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("kspec/cli/main.py", "kspec/engine/request.py", "kspec/kernels/contract.py", "kspec/bench/stats.py"):
        assert module in names


def test_installed_kspec_hides_the_folder_names(tmp_path: Path) -> None:
    """From outside the repository, `kernels` and `engine` are not ours (the editable install)."""
    code = (
        "import importlib.util, kspec.engine.api, kspec.kernels.contract\n"
        "for name in ('kernels', 'engine', 'lsp_server'):\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    print(name, spec is not None and str(spec.origin).startswith(%r))\n" % str(ROOT)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.split() == ["kernels", "False", "engine", "False", "lsp_server", "False"]
