"""Loading an engine with Python's cyclic collector off (engine/serve/runner.py
`default_engine_factory`): the modules the first load imports are frozen out of later
collections, and the collector is on again afterwards, as it was."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import gc, sys

    from kspec.engine.config import EngineConfig
    from kspec.engine.serve.runner import default_engine_factory

    before = gc.get_freeze_count()
    engine = default_engine_factory(EngineConfig(progress=False, fit_to_machine=False), lambda fraction, message: None)
    frozen = gc.get_freeze_count()
    print(before == 0, frozen > 100_000, gc.isenabled(), "torch" in sys.modules)
    default_engine_factory(EngineConfig(progress=False, fit_to_machine=False), lambda fraction, message: None)
    print(gc.get_freeze_count() == frozen, gc.isenabled())  # a second load imports nothing: nothing more frozen
    gc.disable()
    default_engine_factory(EngineConfig(progress=False, fit_to_machine=False), lambda fraction, message: None)
    print(gc.isenabled())  # off stays off
    """
)


def test_a_load_freezes_its_imports_once_and_leaves_the_collector_as_it_was() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "True", "True", "True", "True", "False"], done.stdout + done.stderr[-2000:]
