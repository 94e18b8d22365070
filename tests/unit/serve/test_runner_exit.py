"""An engine runner whose owner never calls stop() does not keep the process alive at exit: its
(non-daemon) worker is stopped when the main thread ends (engine/serve/main_exit.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import asyncio, threading

    from kspec.engine.api import Completion, CompletionRequest, CompletionResult
    from kspec.engine.config import EngineConfig
    from kspec.engine.serve.runner import EngineRunner


    class Echo:
        model_name = "fake"

        def complete(self, request, cancel=None):
            return CompletionResult([Completion(request.prefix[::-1], 0.0)], self.model_name)


    async def main():
        runner = EngineRunner(EngineConfig(model="fake", progress=False), lambda config, progress: Echo(), lambda status: None)
        runner.start()  # never stopped
        result = await runner.complete(CompletionRequest(prefix="ab"))
        print(result.completions[0].text, runner._thread.daemon, flush=True)


    asyncio.run(main())
    """
)


def test_a_runner_never_stopped_lets_the_process_exit() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ba", "False"]  # it answered, on a non-daemon worker
