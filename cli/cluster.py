"""`kspec cluster up`: N engine replicas on Ray Serve behind one OpenAI-compatible endpoint
(engine/serve/cluster.py; needs the optional extra `cluster`)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from kspec.cli.exits import UsageError
from kspec.cli.logs import add_log_level, configure_logging
from kspec.engine.errors import KspecError
from kspec.cli.commands import engine_config, warn_if_public
from kspec.engine.config import add_flags

INSTALL_HINT = "kspec cluster needs Ray Serve: pip install 'kspec[cluster]'"


def add_cluster_parser(commands: argparse._SubParsersAction) -> None:
    cluster = commands.add_parser("cluster", help="scale-out on Ray Serve: engine replicas behind one endpoint (extra 'cluster')")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    up = actions.add_parser(
        "up",
        help="start N engine replicas behind one OpenAI-compatible endpoint and serve until interrupted",
        description="Starts a local Ray instance (or joins a cluster with --address), deploys N engine replicas "
        "and serves POST /v1/completions and GET /v1/models until SIGINT/SIGTERM. Each document's requests go to "
        "the replica holding its prefix cache while that replica is alive. The model (and draft) must be readable "
        "on every node; --device cuda needs --num-gpus.",
    )
    up.add_argument("--replicas", type=int, default=1, help="engine replicas (default 1)")
    add_flags(up)
    up.add_argument("--host", default="127.0.0.1", help="HTTP host of Serve's proxy (default loopback; any other needs --token-file)")
    up.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0: a free one, printed)")
    up.add_argument("--token-file", type=Path, default=None, help="clients must send 'Authorization: Bearer <the token in this file>'")
    up.add_argument("--max-batch-requests", type=int, default=16, help="requests one replica decodes together (default 16)")
    up.add_argument("--num-cpus", type=float, default=1.0, help="Ray CPUs per replica (default 1; also its torch threads unless --threads is given)")
    up.add_argument("--num-gpus", type=float, default=0.0, help="Ray GPUs per replica (default 0)")
    up.add_argument("--address", default=None, help="join a running Ray cluster ('auto' or HOST:PORT) instead of starting a local one")
    add_log_level(up, "warning")


def _import_cluster():
    try:
        from kspec.engine.serve import cluster
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in ("ray", "starlette", "pydantic"):
            raise KspecError(INSTALL_HINT) from exc
        raise
    return cluster


def run_cluster(args: argparse.Namespace) -> int:
    configure_logging(args, "kspec-cluster")
    if args.cluster_command != "up":
        raise UsageError(f"unknown cluster command {args.cluster_command!r}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    from kspec.engine.serve.auth import read_token
    from kspec.engine.serve.network import is_loopback

    if args.token_file is None and not is_loopback(args.host):
        raise UsageError(
            f"refusing to serve on {args.host} without a token: pass --token-file FILE "
            "(clients then send 'Authorization: Bearer <token>'), or keep the default --host 127.0.0.1"
        )
    token = read_token(args.token_file) if args.token_file is not None else None
    cluster = _import_cluster()
    try:
        options = cluster.ClusterOptions(
            engine_config(args, progress=False), replicas=args.replicas, max_batch_requests=args.max_batch_requests,
            num_cpus=args.num_cpus, num_gpus=args.num_gpus, token=token,
        )  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    warn_if_public(args.host, "cluster")
    logging.getLogger("ray").setLevel(logging.WARNING)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    local = args.address is None
    try:
        if local:
            needed = args.replicas * args.num_cpus
            cpus = max(float(os.cpu_count() or 1), needed)
            if needed > (os.cpu_count() or 1):
                print(f"kspec cluster: warning: {args.replicas} replicas x {args.num_cpus:g} CPUs oversubscribe this machine's {os.cpu_count()} cores", file=sys.stderr)
            cluster.start_ray(None, num_cpus=cpus)
        else:
            try:
                cluster.start_ray(args.address)
            except (ConnectionError, RuntimeError) as exc:
                raise KspecError(f"cannot join the Ray cluster at {args.address}: {exc}") from exc
        print(f"kspec cluster: starting {args.replicas} engine replica(s) of {options.engine.model or 'the default model'}", file=sys.stderr, flush=True)
        url = cluster.deploy(options, args.host, args.port)
        print(f"kspec cluster: serving {url}" + (" (token required)" if token else ""), file=sys.stderr, flush=True)
        while not stop.wait(3600):
            pass
        print("kspec cluster: shutting down", file=sys.stderr, flush=True)
        return 0
    finally:
        try:
            cluster.undeploy(local)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
