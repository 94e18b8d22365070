"""Every instruction set's loops, checked on whatever machine the tests run on: the kernels are
built again for an older -march (`KSPEC_MARCH`, kernels/cpu_layers.py) in a fresh process and
cache folder, and the matmul and attention tests run against that build. An AVX-512 machine so
also checks the AVX2 loops (q4q8/avx2.h, attention/avx2.h) and the generic ones (q4q8/generic.h)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kspec.engine.models.catalog import models_dir
from kspec.engine.models.resolve import cache_root
from kspec.kernels import cpu_layers

HERE = Path(__file__).parent
CPU_FLAGS = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()


MODELS = HERE.parent / "unit" / "models"


def _can_build() -> bool:
    """Whether this machine has what building kspec's C++ ops takes (a C++ compiler and ninja):
    where it does, a build that fails is a defect of the sources, not a reason to skip."""
    from torch.utils.cpp_extension import is_ninja_available

    return shutil.which(os.environ.get("CXX", "c++")) is not None and is_ninja_available()


def test_the_native_build_succeeds_where_it_can() -> None:
    """Every kernel test skips where the ops are not built; so a compile error must fail here."""
    if not _can_build():
        pytest.skip("no C++ compiler or ninja here: the PyTorch ops serve")
    assert cpu_layers.load_matmul(cache_root()) is not None, cpu_layers.unavailable_reason(cache_root())


@pytest.mark.parametrize(
    ("march", "isa", "needs", "model_tests"),
    [
        # AVX2 serves users (Zen 2/3): whole GGUF types and the layer loop on it too
        ("haswell", "avx2", {"avx2", "fma", "f16c", "bmi2"}, ("test_gguf_types.py", "test_native_step.py")),
        # the generic loops: correct, never chosen for speed (no fast path without AVX2), kernels only
        ("x86-64", "scalar", set(), ()),
    ],
)
def test_the_kernels_of_an_older_instruction_set(march: str, isa: str, needs: set[str], model_tests: tuple[str, ...], tmp_path: Path) -> None:
    if platform.machine() != "x86_64" or not needs <= CPU_FLAGS:
        pytest.skip(f"this CPU cannot run a -march={march} build")
    env = {**os.environ, "KSPEC_MARCH": march, "KSPEC_CACHE_DIR": str(tmp_path)}  # kernels built apart from this machine's
    models_dir(tmp_path).symlink_to(models_dir(cache_root()), target_is_directory=True)  # the installed models, shared
    built = subprocess.run(
        [sys.executable, "-c", "from kspec.engine.models.resolve import cache_root; from kspec.kernels import cpu_layers; "
         "print(cpu_layers.matmul_isa(cache_root()) or cpu_layers.unavailable_reason(cache_root()))"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if "could not be built" in built.stdout and not _can_build():
        pytest.skip(built.stdout.strip())
    assert built.stdout.strip().splitlines()[-1] == isa, built.stdout + built.stderr
    again = subprocess.run(
        [sys.executable, "-c", "import sys; from kspec.engine.models.resolve import cache_root; from kspec.kernels import cpu_layers; "
         "print(cpu_layers.matmul_isa(cache_root()), 'torch.utils.cpp_extension' in sys.modules)"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.stdout.split()[-2:] == [isa, "False"], again.stdout + again.stderr  # a later start loads the finished build as it is
    tests = [str(HERE / "test_q4_q8_matmul.py"), str(HERE / "test_branch_attention.py"), *(str(MODELS / name) for name in model_tests)]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests],
        env=env, capture_output=True, text=True, timeout=1200, cwd=HERE.parents[1],
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1].replace("1 skipped", ""), run.stdout[-500:]


def test_a_build_is_loaded_as_it_is_only_where_its_stamp_names_these_flags(tmp_path: Path) -> None:
    """The stamp a finished build leaves vouches for its library: no stamp (a build cut short), a stamp
    of another flag set (other sources, another -march) or a library that does not load means building
    (False), never a stale load; the library this machine built, stamped with these flags, loads."""
    if cpu_layers.load_matmul(cache_root()) is None:
        pytest.skip(cpu_layers.unavailable_reason(cache_root()))
    library = tmp_path / f"{cpu_layers.LIBRARY}.so"
    shutil.copyfile(cpu_layers.build_folder(cache_root()) / library.name, library)
    probe = (
        "import json, sys; from pathlib import Path; from kspec.kernels import cpu_layers; "
        "folder = Path(sys.argv[1]); flags = cpu_layers.build_flags(); stamp = folder / cpu_layers.BUILT_STAMP; "
        "print(cpu_layers._load_built(folder, flags)); stamp.write_text(json.dumps([*flags, '-DKSPEC_CSRC_DIGEST=0'])); "
        "print(cpu_layers._load_built(folder, [*flags, '-DKSPEC_CSRC_DIGEST=1'])); "
        "print(cpu_layers._load_built(folder, [*flags, '-DKSPEC_CSRC_DIGEST=0']), cpu_layers._registered())"
    )  # a fresh process: this one has the ops already, and a second copy's would abort
    run = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["False", "False", "True", "True"], run.stdout + run.stderr
    library.write_bytes(b"not a library")
    assert not cpu_layers._load_built(tmp_path, [*cpu_layers.build_flags(), "-DKSPEC_CSRC_DIGEST=0"])
