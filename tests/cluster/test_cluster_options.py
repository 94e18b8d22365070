"""What `kspec cluster up` and `serve run ... cluster:build_app` take, and how a replica's
error reaches the HTTP answer, without starting Ray (needs the extra 'cluster' installed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kspec.engine.api import CompletionRequest
from kspec.engine.config import EngineConfig
from kspec.engine.errors import DeadlineExceeded, InputError, KspecError
from kspec.engine.serve.wire import Complete, Failed, decode, encode
from kspec.engine.serve.openai_api import ApiError


@pytest.fixture
def cluster():
    """Imported in the test, not at collection: test_cluster_cli hides Ray from a fresh import."""
    pytest.importorskip("ray.serve", reason="the 'cluster' extra (ray[serve]) is not installed")
    from kspec.engine.serve import cluster

    return cluster


def test_serve_run_arguments_take_every_engine_option(cluster, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0ken\n")
    options = cluster.ClusterOptions.from_args(
        {"replicas": "2", "model": "/m", "dtype": "bfloat16", "drafter": "none", "prefix_cache_mb": "64", "threads": "",
         "num_cpus": 2, "token_file": str(tmp_path / "token")}  # fmt: skip
    )
    assert options.replicas == 2 and options.num_cpus == 2.0 and options.token == "t0ken"
    assert options.engine == EngineConfig(model="/m", dtype="bfloat16", drafter="none", prefix_cache_mb=64, progress=False)
    replica = EngineConfig(**options.engine_config())
    assert replica.threads == 2 and not replica.progress  # threads: the replica's Ray CPUs
    with pytest.raises(ValueError, match="unknown argument"):
        cluster.ClusterOptions.from_args({"colour": "blue"})
    with pytest.raises(ValueError, match="dtype"):
        cluster.ClusterOptions.from_args({"dtype": "float8"})


class _FailingRunner:
    def __init__(self, error: KspecError):
        self.error = error

    async def complete(self, request: CompletionRequest, *args):
        raise self.error


@pytest.mark.parametrize(("error", "status"), [(InputError("bad"), 400), (DeadlineExceeded("late"), 504), (KspecError("gone"), 503)])
def test_a_replica_error_reaches_the_client_as_the_engine_raised_it(cluster, error: KspecError, status: int) -> None:
    replica = object.__new__(cluster.KspecEngine)  # without Ray: only what complete() uses
    replica._replica, replica._running, replica._runner = "r1", 0, _FailingRunner(error)
    answer = asyncio.run(replica.complete(encode(Complete("a0", CompletionRequest(prefix="x")))))
    assert answer["replica"] == "r1" and isinstance(decode(answer["event"]), Failed)

    class Engine:  # the ingress's handle, answering with that replica's answer
        class complete:  # noqa: N801
            @staticmethod
            async def remote(call, document=""):
                return answer

    ingress = object.__new__(cluster.KspecIngress)
    ingress._engine = Engine
    with pytest.raises(ApiError) as raised:
        asyncio.run(ingress._complete(CompletionRequest(prefix="x"), "doc"))
    assert raised.value.status == status and raised.value.message == str(error)
    assert raised.value.headers == {cluster.REPLICA_HEADER: "r1"}
