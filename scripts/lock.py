"""Writes constraints.txt: the exact versions, from an environment where the tests pass,
of everything `kspec[dev,cluster,bench]` needs (its dependency closure, nothing else that
happens to be installed). `scripts/setup.sh` and CI install with `-c constraints.txt`, so a
clean machine gets the tested versions. A local version label (torch's "+cpu") is left out:
which build of a version is installed is the index's business (README: CUDA).

    .venv/bin/python scripts/lock.py            # after upgrading and testing
"""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

EXTRAS = ("dev", "cluster", "bench")
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "constraints.txt"


def project_requirements(extras: tuple[str, ...]) -> list[str]:
    """kspec's own requirements and those of `extras`, read from pyproject.toml (the source)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    return texts


def closure(extras: tuple[str, ...]) -> dict[str, str]:
    """name -> installed version of everything kspec[extras] requires, directly or not."""
    found: dict[str, str] = {}
    queue: list[tuple[str, frozenset[str]]] = []
    seen: set[tuple[str, frozenset[str]]] = set()

    def need(texts: list[str], wanted: frozenset[str]) -> None:
        for text in texts:
            requirement = Requirement(text)
            environments = [{"extra": extra} for extra in wanted] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                queue.append((requirement.name, frozenset(requirement.extras)))

    need(project_requirements(extras), frozenset())
    while queue:
        name, wanted = queue.pop()
        if canonicalize_name(name) == "kspec":
            need(project_requirements(tuple(wanted)), frozenset())
            continue
        if (canonicalize_name(name), wanted) in seen:
            continue
        seen.add((canonicalize_name(name), wanted))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # a requirement for another platform or Python, never installed here
        found[canonicalize_name(name)] = dist.version.split("+")[0]
        need(list(dist.requires or []), wanted)
    return found


def main() -> int:
    pins = closure(EXTRAS)
    header = (
        "# Tested versions of everything kspec[dev,cluster,bench] needs; written by scripts/lock.py.\n"
        "# Used by scripts/setup.sh and CI: pip install -c constraints.txt -e '.[dev,cluster]'\n"
    )
    OUT.write_text(header + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    print(f"{OUT}: {len(pins)} pins", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
