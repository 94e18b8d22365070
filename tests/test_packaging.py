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
    csrc = ROOT / "kernels" / "csrc"  # every source and header the build on the user's machine compiles
    for path in csrc.rglob("*"):
        if path.is_file():
            assert f"kspec/kernels/csrc/{path.relative_to(csrc).as_posix()}" in names, path


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


# --- what the distribution declares ---------------------------------------

import ast  # noqa: E402
import tomllib  # noqa: E402
from importlib.metadata import packages_distributions, version  # noqa: E402

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = ("engine", "lsp_server", "cli", "kernels", "bench")
# Imported only where an optional feature runs, each with a clear message when missing.
OPTIONAL = {"triton": "gpu", "flash_attn": None, "ray": "cluster", "starlette": None,  # starlette: what ray[serve] brings
            "transformers": "bench", "matplotlib": "bench", "pyflakes": "bench"}


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(text).name) for text in requirements}


def _third_party_imports(folder: str) -> dict[str, set[str]]:
    """top-level module -> the files importing it, for modules outside the standard library and kspec."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("kspec", "__future__"):
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_import_is_declared() -> None:
    core = _names(PROJECT["dependencies"])
    extras = {name: _names(reqs) for name, reqs in PROJECT["optional-dependencies"].items()}
    distributions = packages_distributions()
    undeclared = []
    for folder in PACKAGES:
        for module, files in _third_party_imports(folder).items():
            if module in OPTIONAL:
                extra = OPTIONAL[module]
                dists = {canonicalize_name(d) for d in distributions.get(module, [module])}
                assert extra is None or dists & extras[extra], f"{module} ({sorted(files)}) belongs in the extra {extra!r}"
                continue
            dists = {canonicalize_name(d) for d in distributions.get(module, [module])}
            if not dists & core:
                undeclared.append(f"{module} in {sorted(files)}")
    assert undeclared == []


def test_pins_and_extras() -> None:
    core = {canonicalize_name(Requirement(t).name): Requirement(t) for t in PROJECT["dependencies"]}
    assert "==" not in str(core["torch"].specifier)  # the index chooses the build, not a pin
    assert "pyflakes" not in core  # only `kspec bench quality` uses it
    assert {"transformers", "matplotlib", "pyflakes"} <= _names(PROJECT["optional-dependencies"]["bench"])
    tree_sitter = [r for name, r in core.items() if name.startswith("tree-sitter")]
    assert all(r.specifier and any(s.operator == "<" for s in r.specifier) for r in tree_sitter), "grammars and tree-sitter need upper bounds"


def test_constraints_pin_every_dependency_at_a_version_it_allows() -> None:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[canonicalize_name(name)] = pinned.strip()
    assert pins["torch"] == "2.13.0"  # no "+cpu": the configured index / find-links give the CPU build
    declared = PROJECT["dependencies"] + [t for extra in ("dev", "cluster", "bench") for t in PROJECT["optional-dependencies"][extra]]
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name == "kspec":
            continue
        assert name in pins, f"constraints.txt has no pin for {name} (run scripts/lock.py)"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {requirement.specifier}"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-c constraints.txt" in setup and "constraints.txt" in setup.split("want=")[1].splitlines()[0]


def test_one_version_source() -> None:
    assert version("kspec") == PROJECT["version"]  # what `kspec --version` and the language server report
    for folder in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            assert f'"{PROJECT["version"]}"' not in path.read_text(encoding="utf-8"), f"{path} writes the version again"
