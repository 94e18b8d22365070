"""Scale-out on Ray Serve (the optional extra `cluster`): N engine replicas behind one
OpenAI-compatible endpoint.

    HTTP ──▶ Serve proxy ──▶ KspecIngress ──handle + DocumentRouter──▶ KspecEngine × N
                             token, /v1/completions,                  one EngineRunner each
                             /v1/models, retries                      (own prefix cache)

Everything a cluster needs is Ray Serve's own: replicas, placement on nodes, health
checks (`check_health` fails when the engine is in state "error"), restarting dead
replicas, the HTTP proxy. Ours is only the routing policy, plugged in at Serve's
request-router extension point (`RequestRouterConfig(request_router_class=...)`, the
one Ray's own PrefixCacheAffinityRouter uses): `DocumentRouter` reads the `document`
argument of each call and keeps a document on the replica that holds its prefix cache
while that replica is alive (kspec.engine.serve.affinity). Serve tells the router which replicas
are alive and which one just died, probes queue lengths, and backs off when every
replica is full; the router returns the document's replica as its first choice and the
others as a fallback, so a replica whose queue is full (max_ongoing_requests) spills
the request to the least loaded other one instead of queueing it forever. We chose this
over N single-replica deployments with hashing in the ingress because Serve keeps
owning replica health, restarts and scaling (`--replicas N` is one deployment's
num_replicas, autoscaling stays possible), and the router sees every live replica.

A replica that dies while answering: the ingress's call raises ActorDiedError, Serve's
router drops that replica (on_replica_actor_died), and the ingress sends the request
again with what is left of its deadline; DocumentRouter places the document on a live
replica and keeps it there afterwards. Requests without a document key go to the less
loaded of two random replicas (power of two choices, as Serve's default router).

The answering replica's id is in the response header `x-kspec-replica`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve._private.constants import SERVE_NAMESPACE  # where Serve creates its actors
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import JSONResponse

from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.config import EngineConfig, from_values
from kspec.engine.config import options as engine_options
from kspec.engine.errors import DeadlineExceeded, EngineUnavailable, KspecError, ProtocolError
from kspec.engine.serve.affinity import MAX_DOCUMENTS, DocumentPlacement
from kspec.engine.serve.http_api import MAX_BODY, HttpApi
from kspec.engine.serve.auth import read_token
from kspec.engine.serve.network import free_port
from kspec.engine.serve.openai_api import ApiError, error_body
from kspec.engine.serve.wire import Complete, Failed, Final, decode, encode, envelope

log = logging.getLogger("kspec.cluster")

APP_NAME = "kspec"
ENGINE_DEPLOYMENT = "KspecEngine"
INGRESS_DEPLOYMENT = "KspecIngress"
REPLICA_HEADER = "x-kspec-replica"
MAX_ATTEMPTS = 3  # the first try and two more on other replicas when one dies
DEADLINE_GRACE_S = 60.0  # a safety net: the engine answers at the first round past the deadline, which on a saturated CPU can be many seconds
HEALTH_TIMEOUT_S = 5.0


# -- routing -------------------------------------------------------------------------------


class DocumentRouter(RequestRouter):
    """Serve request router: a document's calls go to its replica while that replica is alive.

    Calls name their document with the keyword argument `document`; `replica` (an id
    from `x-kspec-replica`) asks for one replica while it is alive (diagnostics, tests).
    """

    def initialize_state(self, max_documents: int = MAX_DOCUMENTS, **_: Any) -> None:
        self._placement = DocumentPlacement(max_documents)

    @property
    def placement(self) -> DocumentPlacement:
        if not hasattr(self, "_placement"):
            self._placement = DocumentPlacement()
        return self._placement

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        kwargs = pending_request.kwargs if pending_request is not None else {}
        if pending_request is not None:
            # Back off between rounds when every replica is full, instead of probing in a loop.
            pending_request.routing_context.should_backoff = True
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        pinned = kwargs.get("replica") or ""
        if pinned in by_id:
            return [[by_id[pinned]]]
        document = kwargs.get("document") or ""
        if not document:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        home = by_id[self.placement.choose(document, by_id)]
        others = [replica for replica in candidate_replicas if replica is not home]
        return [[home], others] if others else [[home]]

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.placement.forget_replica(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = {replica_id.unique_id for replica_id in self._replica_id_set}
        super().update_replicas(replicas)
        for gone in before - {replica_id.unique_id for replica_id in self._replica_id_set}:
            self.placement.forget_replica(gone)


# -- the engine replica --------------------------------------------------------------------


class KspecEngine:
    """One engine replica: an EngineRunner (continuous batching, own prefix cache)."""

    async def __init__(self, engine_config: dict[str, Any], max_batch_requests: int):
        from kspec.engine.serve.runner import EngineRunner, default_engine_factory
        from kspec.engine.serve.status import ERROR, LOADING

        self._error_state = ERROR
        loaded = asyncio.Event()

        def on_status(status) -> None:
            if status.state != LOADING:
                loaded.set()

        self._replica = serve.get_replica_context().replica_id.unique_id
        self._running = 0
        self._runner = EngineRunner(EngineConfig(**engine_config), default_engine_factory, on_status, max_batch_requests)
        self._runner.start()
        await loaded.wait()
        status = self._runner.status
        if status.state == ERROR:
            self._runner.stop()
            raise KspecError(status.message)  # Serve reports the deployment as failed, with this message
        self._model = status.model
        log.info("replica %s ready: %s", self._replica, self._model)

    async def complete(self, message: bytes, document: str = "") -> dict[str, Any]:
        """A `Complete` message (wire.py, encoded) in; its `Final` or `Failed` event out, encoded,
        with the replica's name. `document` is read by DocumentRouter only. Errors come back as
        data, not exceptions."""
        self._running += 1
        try:
            complete = decode(message)
            if not isinstance(complete, Complete):
                raise ProtocolError(f"an engine replica takes 'complete' messages, not {envelope(message).type!r}")
            event: Final | Failed = Final(complete.id, await self._runner.complete(complete.request))
        except KspecError as exc:
            event = Failed.of(envelope(message).id, exc)
        finally:
            self._running -= 1
        return {"replica": self._replica, "event": encode(event)}

    async def info(self, replica: str = "") -> dict[str, Any]:
        """This replica's id, state and load (`replica` is read by DocumentRouter only)."""
        import os

        status = self._runner.status
        context = ray.get_runtime_context()
        return {
            "replica": self._replica, "state": status.state, "model": self._model, "running": self._running,
            "pid": os.getpid(), "actor": context.get_actor_name(), "namespace": SERVE_NAMESPACE,
        }

    def check_health(self) -> None:
        """Serve calls this periodically; raising marks the replica unhealthy and replaces it."""
        status = self._runner.status
        if status.state == self._error_state:
            raise RuntimeError(f"engine in state error: {status.message}")

    def __del__(self) -> None:
        runner = getattr(self, "_runner", None)
        if runner is not None:
            runner.stop()


# -- the HTTP ingress ----------------------------------------------------------------------


class KspecIngress:
    """The endpoint, with the routes, token check and errors of kspec.engine.serve.http_api
    (`POST /v1/completions`, `GET /v1/models`, `GET /health`), over the engine replicas.
    Each answer names its replica in `x-kspec-replica`."""

    def __init__(self, engine: DeploymentHandle, token: str | None = None):
        self._engine = engine
        self._model: str | None = None
        self._api = HttpApi(self._complete, self._model_name, self._ready, token or None)

    async def __call__(self, http: Request) -> JSONResponse:
        declared = http.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            status, payload, headers = 413, error_body(f"the body exceeds {MAX_BODY} bytes"), {}
        else:
            status, payload, headers = await self._api.respond(http.method, http.url.path, dict(http.headers), await http.body())
        return JSONResponse(payload, status_code=status, headers=headers)

    async def _ready(self) -> tuple[bool, str]:
        try:
            info = await asyncio.wait_for(self._engine.info.remote(), HEALTH_TIMEOUT_S)
        except (asyncio.TimeoutError, RayActorError, ActorUnavailableError):
            return False, "no engine replica answers"
        return info.get("state") == "ready", str(info.get("state"))

    async def _model_name(self) -> str:
        if self._model is None:
            info = await self._engine.info.remote()
            self._model = info["model"]
        return self._model

    async def _complete(self, request: CompletionRequest, document: str) -> tuple[CompletionResult, dict[str, str]]:
        answer = await self._complete_with_failover(request, document)
        headers = {REPLICA_HEADER: answer["replica"]}
        event = decode(answer["event"])
        if isinstance(event, Failed):
            raise ApiError.of(event.error(), headers)
        if not isinstance(event, Final):
            raise ApiError.of(ProtocolError(f"an engine replica answered {envelope(answer['event']).type!r}"), headers)
        return event.result, headers

    async def _complete_with_failover(self, request: CompletionRequest, document: str) -> dict[str, Any]:
        """Send the request; when its replica dies, send it again elsewhere with the time left."""
        deadline = time.monotonic() + request.deadline_ms / 1000
        failure: BaseException | None = None
        for attempt in range(MAX_ATTEMPTS):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0.001:
                break
            call = encode(Complete(f"a{attempt}", replace(request, deadline_ms=remaining_s * 1000)))
            try:
                return await asyncio.wait_for(self._engine.complete.remote(call, document=document), remaining_s + DEADLINE_GRACE_S)
            except (RayActorError, ActorUnavailableError) as exc:  # ActorDiedError is a RayActorError
                failure = exc
                log.warning("an engine replica was lost during a request (attempt %d of %d): %s", attempt + 1, MAX_ATTEMPTS, type(exc).__name__)
            except asyncio.TimeoutError:
                raise ApiError.of(DeadlineExceeded("no engine replica answered before the deadline")) from None
        if failure is None:
            raise ApiError.of(DeadlineExceeded("the deadline passed before an engine replica could answer"))
        raise ApiError.of(EngineUnavailable(f"engine replicas kept failing: {type(failure).__name__}"))


# -- building and running the application ----------------------------------------------------


@dataclass(frozen=True)
class ClusterOptions:
    """What `kspec cluster up` and `serve run ... kspec.engine.serve.cluster:build_app` take:
    the replicas' engine (threads None: each replica's Ray CPUs, at least 1) and the cluster's own options."""

    engine: EngineConfig = field(default_factory=lambda: EngineConfig(progress=False))
    replicas: int = 1
    max_batch_requests: int = 16
    num_cpus: float = 1.0  # Ray CPUs reserved per engine replica
    num_gpus: float = 0.0  # Ray GPUs per engine replica
    token: str | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.max_batch_requests < 1:
            raise ValueError(f"max_batch_requests must be >= 1, got {self.max_batch_requests}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")
    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "ClusterOptions":
        """From `serve run` arguments (strings on the command line, typed in a YAML file):
        any engine option (kspec.engine.config) and the cluster's own; `token_file` reads
        the token from a file on the machine that builds the app."""
        args = dict(args)
        token_file = args.pop("token_file", None)
        engine_names = {f.name for f in engine_options()}
        own = {f.name: f for f in fields(cls) if f.name not in ("engine", "token")}
        unknown = set(args) - engine_names - set(own)
        if unknown:
            known = ", ".join([*(f.name for f in engine_options()), *own, "token_file"])
            raise ValueError(f"unknown argument(s) {', '.join(sorted(unknown))}; known: {known}")
        values: dict[str, Any] = {"engine": from_values({k: v for k, v in args.items() if k in engine_names}, progress=False)}
        for name, value in args.items():
            if name in own and value is not None and value != "":
                values[name] = type(own[name].default)(value)
        if token_file:
            values["token"] = read_token(str(token_file))
        return cls(**values)

    def engine_config(self) -> dict[str, Any]:
        """Each replica's EngineConfig, as the keyword arguments Ray hands to it."""
        threads = self.engine.threads or max(1, int(self.num_cpus))
        return asdict(replace(self.engine, threads=threads, progress=False))


def build_application(options: ClusterOptions) -> serve.Application:
    engine = serve.deployment(KspecEngine).options(
        name=ENGINE_DEPLOYMENT,
        num_replicas=options.replicas,
        # Past twice a batch, a request waits less on a less busy replica than behind its document's one.
        max_ongoing_requests=2 * options.max_batch_requests,
        ray_actor_options={"num_cpus": options.num_cpus, "num_gpus": options.num_gpus},
        health_check_period_s=5.0,
        health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=10.0,
        request_router_config=RequestRouterConfig(request_router_class="kspec.engine.serve.cluster:DocumentRouter"),
    )
    ingress = serve.deployment(KspecIngress).options(
        name=INGRESS_DEPLOYMENT, num_replicas=1, max_ongoing_requests=10000, ray_actor_options={"num_cpus": 0}
    )
    return ingress.bind(engine.bind(options.engine_config(), options.max_batch_requests), options.token)


def build_app(args: dict[str, Any]) -> serve.Application:
    """For `serve run kspec.engine.serve.cluster:build_app replicas=2 ...` and examples/serve.yaml."""
    return build_application(ClusterOptions.from_args(args))


def start_ray(address: str | None, num_cpus: float | None = None) -> None:
    """Connect to a running cluster (`address`), or start a local Ray instance."""
    if ray.is_initialized():
        return
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False, "configure_logging": True}
    if address:
        ray.init(address=address, **quiet)
    else:
        # "local": a new instance even when RAY_ADDRESS or a `ray start` cluster is around
        # (joining one is --address; its other apps must survive our shutdown).
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **quiet)


def deploy(options: ClusterOptions, host: str, port: int) -> str:
    """Start Serve's proxy on host:port (0: a free port) and run the app; the endpoint URL."""
    if port == 0:
        port = free_port(host)
    serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
    try:
        serve.run(build_application(options), name=APP_NAME, route_prefix="/")
    except RuntimeError as exc:
        raise KspecError(f"the deployment failed: {_failure_reason(exc)}") from exc
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def _failure_reason(exc: RuntimeError) -> str:
    """Serve's message names the failed deployment; the replica's own error is in its status."""
    try:
        application = serve.status().applications.get(APP_NAME)
    except Exception:  # Serve itself is gone: its message is all there is
        application = None
    for deployment in (application.deployments.values() if application is not None else ()):
        for line in reversed(deployment.message.splitlines()):
            if "KspecError: " in line:
                return line.split("KspecError: ", 1)[1].strip()
    return str(exc)


def undeploy(local: bool) -> None:
    """Remove the app; a local instance we started goes with Serve and Ray."""
    if not ray.is_initialized():
        return
    if local:
        serve.shutdown()
        ray.shutdown()
    else:
        serve.delete(APP_NAME)
        ray.shutdown()


def describe(options: ClusterOptions) -> dict[str, Any]:
    shown = asdict(options)
    shown["token"] = "(set)" if options.token else None
    return shown
