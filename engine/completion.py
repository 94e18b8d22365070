"""The completion engine: the loaded models and their caches, and the two ways to run
requests on them — one on its own (`complete`) or many decoded together (`batcher`)."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from dataclasses import asdict
from typing import Any

import torch

from kspec.engine.api import CancelToken, CompletionRequest, CompletionResult
from kspec.engine.batching import BatchConfig, ContinuousBatcher
from kspec.engine.waiting_line import WaitingLine
from kspec.engine.busy_cores import CoreGovernor, OtherProcesses
from kspec.engine.cache.prefix_cache import PrefixCache, PrefixCacheConfig
from kspec.engine.config import FIT_NEUTRAL_FIELDS, EngineConfig
from kspec.engine.decode.speculative import DraftBudget, DraftPayoffs
from kspec.engine.machine_fit import PROMPT_TOKENS_RANGE, FIT_CACHE_FILE, TIMING_METHOD, FitCache, MachineDefaults, MachineTiming, choose_defaults, cpu_share, usable_cores
from kspec.engine.json_file import identity_key
from kspec.engine.prompt import PromptStarts
from kspec.engine.models.gguf_convert import ProgressCallback
from kspec.engine.models.head_cost import HeadCost, measure_head
from kspec.engine.models.loading import LoadedModel, check_draft_compatible, load_model
from kspec.engine.models.resolve import cache_root
from kspec.engine.version import version
from kspec.kernels import cpu_layers

KEYSTROKE_INDENT, KEYSTROKE_WORD = "    ", "print"  # a line typed after CALIBRATION_CODE, the word a character a keystroke
# PyTorch's thread count when kspec was imported (its default, or the caller's own choice): where an
# engine's core governor starts, not what an earlier engine's governor left behind in this process
# (torch's count is the process's, and a governor lowers it while a core is taken)
THREADS_AT_IMPORT = torch.get_num_threads()

CALIBRATION_CODE = """import os


def list_python_files(folder):
    \"\"\"Every .py file under folder, sorted.\"\"\"
    names = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if name.endswith(".py"):
                names.append(os.path.join(root, name))
    return sorted(names)


def count_lines(path):
    with open(path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


def main():
    total = 0
    for path in list_python_files("."):
        total += count_lines(path)
"""

class CompletionEngine:
    """Satisfies `request.EngineParts` (what a request uses) and `batching.BatchEngine`."""

    def __init__(self, target: LoadedModel, config: EngineConfig, draft: LoadedModel | None = None):
        self.target, self.draft, self.config = target, draft, config
        self.prefix_cache = PrefixCache(PrefixCacheConfig(max_bytes=config.prefix_cache_mb * 1024 * 1024))
        self.draft_prefix_cache = PrefixCache(PrefixCacheConfig(max_bytes=config.prefix_cache_mb * 1024 * 1024 // 4))
        self.draft_payoffs = DraftPayoffs()
        self.draft_budget = DraftBudget()
        self.prompt_starts = PromptStarts()
        self.lock = threading.Lock()  # one round at a time: the model and caches are not re-entrant
        self.defaults: MachineDefaults | None = None  # set by fit_to_machine()
        # the thread count follows the free cores, unless the user pinned it (or on a GPU)
        self.cores = None if config.threads or config.device != "cpu" else CoreGovernor(
            THREADS_AT_IMPORT, lambda: (self.defaults.round_ms, self.defaults.k) if self.defaults is not None else None, torch.set_num_threads,
            others=OtherProcesses().since_last,
        )  # fmt: skip
        if self.cores is not None:
            torch.set_num_threads(THREADS_AT_IMPORT)

    @classmethod
    def load(cls, config: EngineConfig, on_progress: ProgressCallback | None = None) -> "CompletionEngine":
        """on_progress(fraction in [0, 1], message) is called as loading advances."""
        report = on_progress or (lambda fraction, message: None)
        if config.threads:
            torch.set_num_threads(config.threads)
        share = 0.9 if config.draft else 1.0
        target = load_model(config.model, config, lambda f, m: report(share * f, m))
        draft = load_model(config.draft, config, lambda f, m: report(share + (1 - share) * f, m)) if config.draft else None
        if draft is not None:
            check_draft_compatible(target, draft)
        engine = cls(target, config, draft)
        if config.fit_to_machine:
            report(0.99, "timing this machine")
            engine.fit_to_machine(FitCache(cache_root() / FIT_CACHE_FILE))
        report(1.0, "ready")
        return engine

    def measure_machine(self) -> MachineTiming:
        """Time a prefill and decode rounds at a few k on real code, through `complete`, and
        the share of the cores the process got meanwhile (`MachineTiming.cpu_share`)."""
        cpu_started, wall_started = time.process_time(), time.perf_counter()

        def run(prefix: str, k: int, max_tokens: int) -> CompletionResult:
            request = CompletionRequest(prefix=prefix, k=k, max_tokens=max_tokens, raw=True, cursor_rules=False, deadline_ms=120_000)
            return self.complete(request)

        self.clear_caches()
        run(CALIBRATION_CODE[:200], 1, 2)  # warm-up: first passes allocate
        cold = run(CALIBRATION_CODE, 1, 1)
        per_token = cold.timing_ms["prefill"] / max(1.0, cold.timing_ms.get("prompt_tokens", 1.0) - cold.timing_ms.get("reused_prompt_tokens", 0.0))
        # A typed character, its line's start cached (the previous keystroke's prompt): one
        # token changes, as when typing a word. The median of a few such keystrokes.
        line = CALIBRATION_CODE + KEYSTROKE_INDENT
        run(line + KEYSTROKE_WORD[:1], 1, 1)
        keystroke = statistics.median(
            run(line + KEYSTROKE_WORD[:end], 1, 1).timing_ms["prefill"] for end in range(2, len(KEYSTROKE_WORD) + 1)
        )
        rounds = {}
        for k in (2, 4):
            result = run(CALIBRATION_CODE, k, 12)
            rounds[k] = result.timing_ms["decode"] / max(1.0, result.timing_ms.get("rounds", 1.0))
        self.clear_caches()
        model = self.target.model
        head = measure_head(model.logits, model.args.dim, model.dtype) if model.head_cost is not None else {}
        share = cpu_share(time.process_time() - cpu_started, time.perf_counter() - wall_started, torch.get_num_threads())
        return MachineTiming(rounds, per_token, keystroke, share, head)

    def fit_to_machine(self, cache: FitCache | None = None) -> MachineDefaults:
        """Measure this machine (or take what `cache` holds for this engine here) and choose
        the defaults a typist needs (`machine_fit`). A timing taken while other work competed
        for the cores is kept for an hour (`BUSY_MAX_AGE_S`), then a start measures again."""
        key = identity_key(self.fit_identity())
        timing = cache.get(key) if cache is not None else None
        if timing is None:
            timing = self.measure_machine()
            if cache is not None:
                cache.put(key, timing)
        self.defaults = choose_defaults(timing, self.config.prompt_tokens)
        model = self.target.model
        if model.head_cost is not None and len(timing.head_ms) >= 2:
            model.head_cost = HeadCost.fitted(timing.head_ms, model.head_cost.max_rows)
        return self.defaults

    def fit_identity(self) -> dict[str, Any]:
        """What this engine's timing depends on: its models' files, its settings, this machine,
        torch and its threads, kspec's version."""
        device = torch.device(self.config.device)
        return {
            "models": [[str(m.folder), m.files(), m.compute] for m in (self.target, self.draft) if m is not None],
            "config": {name: value for name, value in asdict(self.config).items() if name not in FIT_NEUTRAL_FIELDS},
            "machine": [platform.node(), platform.machine(), _cpu_name(), os.cpu_count(), usable_cores()],
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": [torch.__version__, torch.get_num_threads()],
            "kspec": version(),
            "timing_method": TIMING_METHOD,
        }

    def clear_caches(self) -> None:
        """Forget every prompt's KV (the target's and the draft's prefix caches): the next request starts cold."""
        self.prefix_cache.clear()
        self.draft_prefix_cache.clear()

    @property
    def model_name(self) -> str:
        return self.target.name

    @property
    def attention(self) -> dict[str, str]:
        """The attention paths the target takes (kernels/paths.py), shown in the status and `complete --json`."""
        return self.target.attention

    @property
    def kernels(self) -> str:
        """How the target computes and why (the measured kernel choice, where one was made), for the status."""
        model = self.target.model
        choice, head = model.kernel_choice, model.head_cost
        return self.target.compute + (f"; {choice.why}" if choice is not None else "") + (f"; {head.describe()}" if head is not None else "")

    @property
    def prompt_tokens(self) -> int:
        """The machine's defaults' budget (a cold prompt, a new document or place, is prefilled in
        about `machine_fit.COLD_PROMPT_MS`) unless `config.prompt_tokens` pins one; not fitted:
        the pin or the largest budget a fit chooses."""
        if self.defaults is not None:
            return self.defaults.prompt_tokens
        return self.config.prompt_tokens or PROMPT_TOKENS_RANGE[1]

    @property
    def suffix_tokens(self) -> int | None:
        """The machine's defaults' cap on the text after the cursor (what a keystroke re-reads in
        about `machine_fit.SUFFIX_REREAD_MS`); not fitted: none (the prompt budget's share)."""
        return self.defaults.suffix_tokens if self.defaults is not None else None

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult:
        """One request on its own (the CLI, `kspec eval`): a batch of one, run to the end."""
        outcome: list[tuple[CompletionResult | None, BaseException | None]] = []
        batcher = self.batcher(max_requests=1)
        batcher.add(request, cancel or CancelToken(), lambda result, error: outcome.append((result, error)))
        while not batcher.idle:
            batcher.run_round()
        result, error = outcome[0]
        if error is not None:
            raise error
        assert result is not None
        return result

    def batcher(self, max_requests: int, waiting: WaitingLine | None = None) -> ContinuousBatcher:
        """Requests of several clients decoded together (continuous batching); they wait in
        `waiting` (the runner's line, shared with its event loop) until they join."""
        return ContinuousBatcher(self, BatchConfig(max_requests=max_requests), self.cores, waiting)


def _cpu_name() -> str:
    """The CPU's model name where the system says it (Linux), else the platform's word for it."""
    return cpu_layers.cpu_info().get("model name") or platform.processor()
