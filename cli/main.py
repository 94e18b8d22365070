"""`kspec` command line: complete, eval, bench, lsp, engine, cluster. Exit codes: cli/exits.py."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, cast

from kspec.engine.api import MAX_K, MAX_NEW_TOKENS
from kspec.engine.errors import KspecError
from kspec.cli.cluster import add_cluster_parser, run_cluster
from kspec.cli.commands import add_engine_parser, add_lsp_parser, engine_config, run_engine, run_lsp
from kspec.cli.exits import EXIT_INTERRUPTED, UsageError, exit_code
from kspec.cli.logs import add_log_level, configure_logging
from kspec.cli.models import add_models_parser, run_models
from kspec.engine.config import add_flags
from kspec.engine.version import version

if TYPE_CHECKING:
    from kspec.engine.completion import CompletionEngine


def _generation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-k", type=int, default=4, help="number of alternatives (default 4)")
    parser.add_argument("--max-tokens", type=int, default=48, help="new tokens per alternative (default 48)")
    parser.add_argument(
        "--mode", choices=["diverse", "sample"], default="diverse",
        help="diverse: the k most likely distinct alternatives (greedy after k different first tokens); sample: k samples (default diverse)",
    )  # fmt: skip
    parser.add_argument("--temperature", type=float, default=0.0, help="for --mode sample (0 = 0.8)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for --mode sample: keep the most likely tokens up to this probability mass (default 1.0: all)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for --mode sample (default 0)")
    parser.add_argument("--deadline-ms", type=float, default=60000.0, help="answer with what is complete after this many milliseconds (default 60000)")
    parser.add_argument("--raw", action="store_true", help="show untrimmed alternatives")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kspec", description="k alternative code completions at a cursor",
        epilog="Exit status: 0 done, 1 runtime error (missing file, model or engine), 2 usage error, 130 interrupted. "
        "Logs: --log-level or $KSPEC_LOG_LEVEL (debug, info, warning, error).",
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    complete = commands.add_parser("complete", help="complete at PATH:LINE:COL (1-based)")
    complete.add_argument("location", help="PATH:LINE:COL, 1-based")
    complete.add_argument("--json", action="store_true", help="print one JSON object")
    complete.add_argument(
        "--no-context", action="store_true",
        help="leave out the definitions the file imports (resolved in the current folder, or the file's; --json says which went in)",
    )  # fmt: skip
    add_flags(complete)
    add_log_level(complete, "warning")
    _generation_args(complete)

    evaluate = commands.add_parser("eval", help="complete every case of a JSONL file")
    evaluate.add_argument("cases", help='JSONL: {"id", "prefix", "suffix", "language", ...} per line')
    evaluate.add_argument("--out", required=True, help="results JSONL, one line per case in case order")
    evaluate.add_argument("--json", action="store_true", help="print the summary as one JSON line (no progress bar when stdout is a pipe)")
    add_flags(evaluate)
    add_log_level(evaluate, "warning")
    _generation_args(evaluate)

    bench = commands.add_parser("bench", help="measure speed, side by side in one run")
    bench.add_argument(
        "what",
        choices=["generate", "attention", "step", "keystroke", "decode", "quality", "serve", "peer", "clients"],
        help="generate: our batched decoding vs transformers generate(); attention: bifurcated vs replicated "
        "attention alone; step: a whole decode step (logits included) per compute path for k branches and a "
        "verification of k x (gamma+1) rows, with the bytes-read floor, at a 512-token prompt or each of --contexts "
        "(with --contexts and no --paths: shared vs replicated prefix KV); keystroke: prefix-cache hit vs cold prefill, "
        "how often typing at the language server's window makes a cold prompt (\"prompt_starts\"), "
        "then typing replayed through kspec lsp (under \"lsp\": kspec vs the previous configuration); "
        "serve: N editors at once, continuous batching vs one request at a time (or --url endpoints); "
        "peer: kspec's engine beside llama.cpp's llama-server (--llama-server) on the same GGUF, keystrokes "
        "interleaved through both servers' /completion, and their resident memory; clients: what a plain LSP client "
        "(no kspec extensions) gets when it asks at fresh positions (HumanEval function bodies, --repeats of them, "
        "default 20): the share with >= 2 distinct whole alternatives, fragments, latency",
    )
    bench.add_argument("--json", action="store_true", help="print the report as one JSON line (no progress bar when stdout is a pipe)")
    bench.add_argument(
        "--paths", default=None,
        help="step: comma-separated compute paths compared side by side: --dtype values, or auto/4bit and "
        "auto/4bit+dense for the fast path's --cpu-weights, auto/torch for its --cpu-kernels, auto/int4=kspec or "
        "auto/int4=torch for its --cpu-int4, auto/kv=float32 or auto/kv=float16 for its --cpu-kv (combined: "
        "auto/4bit/int4=kspec; default float32,auto)",
    )  # fmt: skip
    bench.add_argument("--ks", default=None, help="comma-separated k values")
    bench.add_argument("--contexts", default=None, help="comma-separated context lengths (tokens)")
    bench.add_argument("--max-tokens", type=int, default=None, help="new tokens per branch (default: 48 for quality, 32 otherwise)")
    bench.add_argument("--repeats", type=int, default=None, help="measurements per point (default per bench; serve: rounds, --hop: samples)")
    bench.add_argument(
        "--plot", default=None,
        help="decode: where to write the PNG plot (default bench-decode.png; '' for none); quality --execute: plot the "
        "pass@first / pass@all table there (no plot unless given); needs matplotlib",
    )  # fmt: skip
    bench.add_argument(
        "--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"), help="quality: the shared evaluation data"
    )
    bench.add_argument(
        "--cases-out", type=Path, default=None,
        help="quality: also write every case (what the engine saw, its raw alternatives) to this JSON file",
    )  # fmt: skip
    bench.add_argument(
        "--replay", type=Path, default=None,
        help="quality: post-process the cases of a --cases-out file again, without the model; with --cross-file: "
        "pool the --json reports of several runs (comma-separated files) into one set of figures",
    )  # fmt: skip
    bench.add_argument(
        "--cross-file", action="store_true",
        help="quality: holes that need a name only a sibling module defines, through kspec lsp with the context off, "
        "on with only the file open, and on with the sibling open too (bench/crossfile.py); --repeats: holes (default 24)",
    )  # fmt: skip
    bench.add_argument(
        "--packages", default=None,
        help="quality --cross-file: comma-separated importable packages to cut the holes from (default: email, json, importlib, "
        "http, logging, concurrent, xml, urllib, click, jinja2; others give held-out holes, e.g. asyncio,multiprocessing,setuptools)",
    )  # fmt: skip
    bench.add_argument(
        "--steering", default=None,
        help="quality: the bench once per branch-steering setting, comma-separated BRANCHES or BRANCHES@FLOOR "
        "(steer_branches, steer_min_logprob; e.g. 0,1@-20), one engine, same holes (bench/steering.py)",
    )  # fmt: skip
    bench.add_argument(
        "--execute", action="store_true",
        help="quality: run the suggestions instead: HumanEval infilling (single- and multi-line) and MBXP Python and "
        "JavaScript holes, each k of --ks (default 1,4,8) at each time budget of --budgets, every alternative run against "
        "the task's tests in a sandbox; reports pass@first, pass@all and latency (docs/measurements/executed-quality.md)",
    )  # fmt: skip
    bench.add_argument(
        "--others-temperature", type=float, default=None,
        help="quality (holes and --execute): ask with this CompletionRequest.others_temperature: > 0 keeps branch 0 greedy "
        "and samples the other k - 1 at this temperature (seeded: --seed); 0: the diverse split (default: the request's default)",
    )  # fmt: skip
    bench.add_argument("--top-p", type=float, default=None, help="quality (holes and --execute): the requests' top_p (default: the request's default)")
    bench.add_argument("--seed", type=int, default=None, help="quality (holes and --execute): the requests' sampling seed (default 0)")
    bench.add_argument("--budgets", default=None, help="quality --execute: comma-separated time budgets per request in seconds (default 0.25,0.5,1,2)")
    bench.add_argument("--tasks", type=int, default=None, help="quality --execute: tasks per source (default 8 per HumanEval file, 4 per MBXP language; seeded)")
    bench.add_argument("--full", action="store_true", help="quality --execute: every task of every source (thousands: hours on a CPU)")
    bench.add_argument("--warm-prompt", action="store_true", help="quality --execute: prefill each prompt first, untimed, as the previous keystroke would (default: cold)")
    bench.add_argument(
        "--lsp-points", type=int, default=3,
        help="keystroke: places in Python's textwrap.py typed again through kspec lsp, kspec's defaults vs the previous "
        "configuration (fp32, no early answer), interleaved (default 3). --model, --device, --threads and, when given, "
        "the first of --ks and --max-tokens apply to both; --dtype does not (kspec: the server's default, previous: float32)",
    )  # fmt: skip
    bench.add_argument("--lsp-chars", type=int, default=20, help="keystroke: characters typed at each place, one request per keystroke (default 20)")
    bench.add_argument("--lsp-cps", type=float, default=10.0, help="keystroke: typing speed in characters per second (default 10)")
    bench.add_argument(
        "--lsp-pause-ms", type=float, default=500.0,
        help="keystroke: extra pause after each character that ends a word (space, bracket, punctuation); 0: no breaks (default 500)",
    )  # fmt: skip
    bench.add_argument("--editors", default=None, help="serve: comma-separated numbers of editors typing at once (default 1,4,16)")
    bench.add_argument("--requests-per-editor", type=int, default=3, help="serve: completions each editor asks for")
    bench.add_argument("--url", action="append", default=None, help="serve: an OpenAI-compatible endpoint (http(s)://HOST:PORT/v1) to drive instead; repeat to compare, interleaved")
    bench.add_argument("--token-file", type=Path, default=None, help="serve: the endpoints' token (API key)")
    bench.add_argument("--hop", action="store_true", help="serve: with one --url, the same request in this process vs through that endpoint (the network / Ray hop)")
    bench.add_argument("--llama-server", type=Path, default=None, help="peer: the llama-server executable to compare with")
    bench.add_argument("--starts", type=int, default=0, help="peer: then start each server this many times alone, alternating, and report spawn-to-healthy seconds (default 0: not measured)")
    bench.add_argument("--peer", type=Path, default=None, metavar="LLAMA_SERVER", help="quality: also ask llama.cpp's llama-server (this executable) for its greedy /infill answer on the same holes, windows and GGUF file, as llama.vim does, and report both side by side")
    add_flags(bench)
    add_log_level(bench, "warning")

    add_lsp_parser(commands)
    add_engine_parser(commands)
    add_cluster_parser(commands)
    add_models_parser(commands)
    return parser


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars go to a terminal's stderr, and not when --json output goes to a pipe."""
    return sys.stderr.isatty() and not (getattr(args, "json", False) and not sys.stdout.isatty())


def _request_fields(args: argparse.Namespace) -> dict:
    if not 1 <= args.k <= MAX_K:
        raise UsageError(f"-k: k must be between 1 and {MAX_K}, got {args.k}")
    if not 1 <= args.max_tokens <= MAX_NEW_TOKENS:
        raise UsageError(f"--max-tokens must be between 1 and {MAX_NEW_TOKENS}, got {args.max_tokens}")
    return {
        "k": args.k,
        "max_tokens": args.max_tokens,
        "mode": args.mode,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "deadline_ms": args.deadline_ms,
        "raw": args.raw,
    }


def _file_context(path: Path, prefix: str, suffix: str, fitted: float | None) -> Any:
    """The definitions the file imports, resolved in its workspace: the current folder when the
    file is inside it, else the file's own folder (the language server also adds open documents)."""
    from kspec.lsp_server.crossfile.gatherer import ContextConfig, ContextGatherer
    from kspec.lsp_server.crossfile.workspace import Source, WorkspaceFiles

    path, text = path.resolve(), prefix + suffix
    folder = Path.cwd().resolve() if path.is_relative_to(Path.cwd().resolve()) else path.parent
    current = Source(path.as_uri(), "", 1, lambda: text)
    config = ContextConfig()
    return ContextGatherer(config).gather(current, prefix.count("\n"), WorkspaceFiles(folder, [current]), config.budget_chars(fitted))


def run_complete(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from kspec.engine.api import CompletionRequest
    from kspec.engine.serve.runner import default_engine_factory
    from kspec.cli.location import read_location

    fields = _request_fields(args)
    context = read_location(args.location)  # validate the file before loading a model
    loading = time.perf_counter()
    engine = cast("CompletionEngine", default_engine_factory(engine_config(args), lambda fraction, message: None))
    load_s = time.perf_counter() - loading
    fitted = engine.defaults.prompt_tokens if engine.defaults is not None else None
    gathered = None if args.no_context else _file_context(context.path, context.prefix, context.suffix, fitted)
    pieces, members = (gathered.pieces, gathered.members) if gathered is not None else ((), ())
    request = CompletionRequest(
        prefix=context.prefix, suffix=context.suffix, path=str(context.path), context=pieces, members=members, **fields
    )  # fmt: skip
    result = engine.complete(request)
    if engine.defaults is not None:  # what the engine chose for this machine (what `kspec lsp` uses unless set)
        result.timing_ms.update({f"machine_{name}": value for name, value in engine.defaults.to_dict().items()})
    if args.json:
        told = {"files": list(dict.fromkeys(p.path for p in pieces)), "chars": sum(len(p.text) for p in pieces),
                "tokens": int(result.timing_ms.get("context_tokens", 0)), "modules": [m.qualifier for m in members]}  # fmt: skip
        print(json.dumps({**asdict(result), "attention": engine.attention, "context": told}, ensure_ascii=False))  # attention: kernels/paths.py
        return 0
    print(f"model: {result.model}    answered in {result.timing_ms.get('total', 0):.0f} ms (the model loaded in {load_s:.1f} s before)")
    for index, completion in enumerate(result.completions, 1):
        print(f"--- {index}/{len(result.completions)}  score {completion.score:.3f}  ({completion.finish_reason})")
        print(completion.text)
    if not result.completions:
        print("(no suggestion)")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from kspec.engine.completion import CompletionEngine
    from kspec.bench.evaluate import evaluate_file, read_cases

    fields = _request_fields(args)
    list(read_cases(args.cases))  # a missing file or bad line is said before a model loads
    engine = CompletionEngine.load(engine_config(args, progress=show_progress(args)))
    summary = evaluate_file(engine, args.cases, args.out, fields, progress=show_progress(args))
    print(json.dumps(summary, indent=None if args.json else 1))
    return 0


def _ints(text: str | None, default: list[int]) -> list[int]:
    return [int(part) for part in text.split(",") if part] if text else default


def _bench_keystroke_lsp(config, args: argparse.Namespace) -> dict:
    """Typing replayed through real language servers: kspec's defaults vs the configuration
    that shipped before (fp32, no early answer), interleaved point by point."""
    import dataclasses

    from kspec.bench.keystroke import bench_keystroke_lsp
    from kspec.engine.serve.runner import default_engine_factory

    def factory(engine_config, on_progress):  # --threads and the CPU fast path's flags reach the engines the servers load
        threads = config.threads if config.threads is not None else engine_config.threads
        return default_engine_factory(dataclasses.replace(engine_config, threads=threads, **config.cpu_fast_path()), on_progress)

    return bench_keystroke_lsp(
        model=config.model, points=args.lsp_points, chars_per_point=args.lsp_chars, cps=args.lsp_cps, pause_ms=args.lsp_pause_ms, device=config.device,
        k=_ints(args.ks, [])[0] if args.ks else None, max_tokens=args.max_tokens, engine_factory=factory,
    )  # fmt: skip


def _bench_prompt_starts(config, args: argparse.Namespace) -> list[dict]:
    """Typing at the language server's window through the engine's prompt building: how
    often a keystroke's prompt is cold, at the fitted minimum and the default budget."""
    import textwrap

    from kspec.bench.keystroke import prompt_starts
    from kspec.engine.machine_fit import PROMPT_TOKENS_RANGE
    from kspec.engine.models.resolve import resolve_model
    from kspec.engine.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(resolve_model(config.model).folder)
    text = Path(textwrap.__file__).read_text(encoding="utf-8")
    return [prompt_starts(tokenizer, text, points=8, length=300, budget=budget) for budget in PROMPT_TOKENS_RANGE]


def _bench_serve(config, args: argparse.Namespace) -> dict:
    from kspec.bench.serve import ServeBenchConfig, bench_hop, bench_serve_inprocess, bench_serve_urls
    from kspec.engine.serve.auth import read_token

    try:
        serve = ServeBenchConfig(
            editors=tuple(_ints(args.editors, [1, 4, 16])), requests_per_editor=args.requests_per_editor,
            k=_ints(args.ks, [2])[0], max_tokens=args.max_tokens or 16, repeats=args.repeats or 1,
        )  # fmt: skip
    except ValueError as exc:
        raise KspecError(str(exc)) from exc
    if args.hop and (not args.url or len(args.url) != 1):
        raise KspecError("--hop needs exactly one --url")
    if args.url:
        token = read_token(args.token_file) if args.token_file else None
        try:
            if args.hop:
                return bench_hop(config, args.url[0], token, samples=args.repeats or 10)
            return bench_serve_urls(args.url, token, serve)
        except ValueError as exc:
            raise KspecError(str(exc)) from exc
    return bench_serve_inprocess(config, serve)


def _bench_peer(config, args: argparse.Namespace) -> dict:
    import dataclasses

    from kspec.bench.peer import PeerBenchConfig, bench_peer
    from kspec.engine.models.resolve import gguf_file

    if args.llama_server is None:
        raise KspecError("kspec bench peer needs --llama-server PATH (build one: ../shared/tools/build-llama-cpp.sh)")
    threads = _bench_threads(config)
    gguf = gguf_file(config.model)
    try:
        peer = PeerBenchConfig(args.llama_server, gguf, threads, ns=tuple(_ints(args.ks, [1, 4])), keystrokes=args.repeats or 5,
                               new_tokens=args.max_tokens or 32, starts=args.starts)  # fmt: skip
    except ValueError as exc:
        raise KspecError(str(exc)) from exc
    return bench_peer(dataclasses.replace(config, threads=threads), peer)


def _floats(text: str | None, default: list[float]) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part] if text else default
    except ValueError as exc:
        raise UsageError(f"expected comma-separated numbers, got {text!r}") from exc


def _request_options(args: argparse.Namespace) -> dict:
    """The quality benches' request options given on the command line (--others-temperature, --top-p, --seed)."""
    given = {"others_temperature": args.others_temperature, "top_p": args.top_p, "request_seed": args.seed}
    return {name: value for name, value in given.items() if value is not None}


def _bench_executed(config, args: argparse.Namespace) -> dict:
    from kspec.bench.executed import DEFAULT_BUDGETS_S, DEFAULT_KS, ExecutedBenchConfig, plot_executed, run_executed_bench
    from kspec.engine.completion import CompletionEngine

    counts = {} if args.tasks is None else {"humaneval_single": args.tasks, "humaneval_multi": args.tasks, "mbxp_per_language": args.tasks}
    try:
        executed = ExecutedBenchConfig(
            ks=tuple(_ints(args.ks, list(DEFAULT_KS))), budgets_s=tuple(_floats(args.budgets, list(DEFAULT_BUDGETS_S))),
            max_tokens=args.max_tokens or 128, full=args.full, warm_prompt=args.warm_prompt, **counts, **_request_options(args),
        )  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if any(k > MAX_K for k in executed.ks):
        raise UsageError(f"--ks: k must be between 1 and {MAX_K}")
    data = Path(args.data)
    if not data.is_dir():
        raise KspecError(f"{data}: evaluation data folder not found (pass --data DIR)")
    engine = CompletionEngine.load(config)
    from tqdm import tqdm

    with tqdm(desc="kspec bench quality --execute", unit="task", disable=not show_progress(args), file=sys.stderr) as bar:
        report = run_executed_bench(engine, data, executed, progress=lambda line: bar.update(1), details=args.cases_out is not None)
    if args.peer is not None:  # the same tasks and budgets through llama.cpp's /infill (its one greedy answer), same file
        import dataclasses

        from kspec.bench.executed import beside_peer

        del engine  # its threads idle while the peer runs; the memory goes back once collected
        peer, gguf = _infill_peer(config, args)
        with peer, tqdm(desc="llama.cpp /infill --execute", unit="task", disable=not show_progress(args), file=sys.stderr) as bar:
            peer_report = run_executed_bench(peer, data, dataclasses.replace(executed, ks=(1,)), progress=lambda line: bar.update(1))
        report = beside_peer(report, peer_report, gguf.name)
    if args.cases_out is not None:
        args.cases_out.write_text(json.dumps({"cases": report.pop("cases")}), encoding="utf-8")
    if args.plot:
        report["plot"] = plot_executed(report, args.plot)
    return report


def _bench_quality(config, args: argparse.Namespace) -> dict:
    from kspec.bench.quality import QualityBenchConfig, replay_quality_bench, run_quality_bench

    if args.cross_file and args.execute:
        raise UsageError("--cross-file and --execute are two benches: give one")
    if args.cross_file:
        return _bench_cross_file(config, args)
    if args.steering is not None:
        from kspec.bench.steering import compare_steering, parse_settings

        try:
            settings = parse_settings(args.steering)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        compared = compare_steering(config, args.data, settings, details=args.cases_out is not None, log=lambda line: print(line, file=sys.stderr))
        if args.cases_out is not None:  # every setting's report, cases included
            args.cases_out.write_text(json.dumps(compared.pop("reports")), encoding="utf-8")
        return compared
    if args.execute:
        if args.replay is not None:
            raise UsageError("--execute does not replay: run it again")
        return _bench_executed(config, args)

    try:
        quality = QualityBenchConfig(k=_ints(args.ks, [4])[0], max_tokens=args.max_tokens or 48, **_request_options(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.replay is not None:
        try:
            cases = json.loads(args.replay.read_text(encoding="utf-8"))["cases"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KspecError(f"{args.replay}: not a file written by --cases-out ({exc})") from exc
        return replay_quality_bench(cases, quality, timing=True)
    from kspec.engine.completion import CompletionEngine

    data = Path(args.data)
    if not data.is_dir():
        raise KspecError(f"{data}: evaluation data folder not found (pass --data DIR)")
    engine = CompletionEngine.load(config)
    details = args.cases_out is not None
    from tqdm import tqdm

    with tqdm(desc="kspec bench quality", unit="case", disable=not show_progress(args), file=sys.stderr) as bar:
        report = run_quality_bench(engine, data, quality, progress=lambda line: bar.update(1), details=details)
    if args.peer is not None:  # the same holes and windows through llama.cpp's /infill, on the same file
        report = _beside_infill_peer(report, config, args, quality, data, details, bar_shown=show_progress(args))
    if details:
        args.cases_out.write_text(json.dumps({"cases": report.pop("cases"), "peer_cases": report.pop("peer_cases", [])}), encoding="utf-8")
    return report


def _bench_threads(config) -> int:
    """The threads a bench gives each side of a comparison: the engine's setting, else every core."""
    import os

    return config.threads or os.cpu_count() or 1


def _infill_peer(config, args: argparse.Namespace):
    """llama.cpp's server on the GGUF file the engine's model setting names (`--peer`), started, and that file."""
    from kspec.bench.infill_peer import InfillPeer
    from kspec.engine.models.resolve import gguf_file

    gguf = gguf_file(config.model)
    return InfillPeer(args.peer, gguf, _bench_threads(config)), gguf


def _beside_infill_peer(report: dict, config, args: argparse.Namespace, quality, data: Path, details: bool, bar_shown: bool) -> dict:
    from tqdm import tqdm

    from kspec.bench.quality import beside_peer, first_lines, run_quality_bench

    peer, gguf = _infill_peer(config, args)
    with peer, tqdm(desc="llama.cpp /infill", unit="case", disable=not bar_shown, file=sys.stderr) as bar:
        peer_report = run_quality_bench(peer, data, quality, progress=lambda line: bar.update(1), details=details, shown_by=first_lines)
    if details:
        report["peer_cases"] = peer_report.pop("cases")
    return beside_peer(report, peer_report, gguf.name)


def _bench_clients(config, args: argparse.Namespace) -> dict:
    from tqdm import tqdm

    from kspec.bench.plain_client import ClientsConfig, run_clients_bench

    try:
        clients = ClientsConfig(Path(args.data), positions=args.repeats or 20, k=_ints(args.ks, [4])[0], model=config.model)
    except ValueError as exc:
        raise KspecError(str(exc)) from exc
    with tqdm(desc="kspec bench clients", unit="position", disable=not show_progress(args), file=sys.stderr) as bar:
        return run_clients_bench(clients, progress=lambda _: bar.update(1))


def _bench_cross_file(config, args: argparse.Namespace) -> dict:
    from tqdm import tqdm

    from kspec.bench.crossfile import CrossFileConfig
    from kspec.bench.crossfile_lsp import run_crossfile_bench

    if args.replay is not None:
        from kspec.bench.crossfile import pool_reports

        paths = [Path(part) for part in str(args.replay).split(",") if part.strip()]
        try:
            return pool_reports([json.loads(path.read_text(encoding="utf-8")) for path in paths])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KspecError(f"{args.replay}: not reports of `kspec bench quality --cross-file --json` ({exc})") from exc
    try:
        packages = {} if args.packages is None else {"packages": tuple(p.strip() for p in args.packages.split(",") if p.strip())}
        cross = CrossFileConfig(holes=args.repeats or 24, k=_ints(args.ks, [4])[0], max_tokens=args.max_tokens or 32, model=config.model,
                               prompt_tokens=config.prompt_tokens, **packages)  # fmt: skip
    except ValueError as exc:
        raise KspecError(str(exc)) from exc
    with tqdm(desc="kspec bench quality --cross-file", unit="cut", disable=not show_progress(args), file=sys.stderr) as bar:
        return run_crossfile_bench(cross, progress=lambda line: bar.update(1))


# What a bench needs beyond kspec's own dependencies: pip install 'kspec[bench]'.
BENCH_NEEDS = {"generate": ("transformers",), "decode": ("matplotlib",), "quality": ("pyflakes",)}


def _check_bench_extra(args: argparse.Namespace) -> None:
    """Before any work: a bench whose optional dependency is missing says what to install."""
    import importlib.util

    needs = BENCH_NEEDS.get(args.what, ())
    if args.what == "decode" and args.plot == "":
        needs = ()
    if args.what == "quality" and args.execute and args.plot:
        needs = (*needs, "matplotlib")
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        hint = " (or --plot '' for no plot)" if args.what == "decode" else ""
        raise KspecError(f"kspec bench {args.what} needs {', '.join(missing)}: pip install 'kspec[bench]'{hint}")


def run_bench(args: argparse.Namespace) -> int:
    _check_bench_extra(args)
    from kspec.bench import decode as bench

    config = engine_config(args, progress=False)
    if args.what == "generate":
        report = bench.bench_generate(config, _ints(args.ks, [1, 4, 8]), args.max_tokens or 32, args.repeats or 3)
    elif args.what == "attention":
        from kspec.bench.attention import bench_attention

        report = bench_attention(_ints(args.ks, [4, 8, 16, 32]), _ints(args.contexts, [1024, 4096, 8192]), args.repeats or 9)
    elif args.what == "quality":
        report = _bench_quality(config, args)
    elif args.what == "decode":
        plot = "bench-decode.png" if args.plot is None else args.plot
        report = bench.bench_decode(config, _ints(args.ks, [1, 4, 8]), args.max_tokens or 32, args.repeats or 1, plot, progress=show_progress(args))
    elif args.what == "serve":
        report = _bench_serve(config, args)
    elif args.what == "peer":
        report = _bench_peer(config, args)
    elif args.what == "clients":
        report = _bench_clients(config, args)
    elif args.what == "step":
        from kspec.bench.step import bench_step

        paths = [p for p in args.paths.split(",") if p] if args.paths else ["float32", "auto"]
        if args.contexts and not args.paths:
            report = bench.bench_decode_step(config, _ints(args.ks, [8])[0], _ints(args.contexts, [1024]), args.repeats or 7)
        else:
            contexts = _ints(args.contexts, [512])
            reports = [bench_step(config, _ints(args.ks, [1, 4, 8]), paths, context, repeats=args.repeats or 9) for context in contexts]
            report = reports[0] if len(reports) == 1 else {"contexts": reports}
    else:
        report = bench.bench_keystroke(config, _ints(args.contexts, [1024])[0], points=4, repeats=args.repeats or 2)
        report["prompt_starts"] = _bench_prompt_starts(config, args)
        report["lsp"] = _bench_keystroke_lsp(config, args)
    print(json.dumps(report, indent=None if args.json else 1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2 here
    handlers = {"complete": run_complete, "eval": run_eval, "bench": run_bench, "lsp": run_lsp, "engine": run_engine, "cluster": run_cluster, "models": run_models}
    try:
        if args.command in ("complete", "eval", "bench"):  # lsp, engine and cluster set up their own (same option)
            configure_logging(args, "kspec")
        return handlers[args.command](args)
    except KspecError as exc:
        print(f"kspec: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print("kspec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
