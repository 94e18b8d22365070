"""Scale-out on Ray Serve: a local Ray instance, 2 CPU engine replicas of a small random
model behind one endpoint; requests over plain HTTP (urllib).

Checks the token, /v1/models, document affinity, spread across replicas, and a replica
killed while it answers a request: the request is answered by another replica and the
document stays there. Ray starts once for the module and is shut down at its end.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

ray = pytest.importorskip("ray", reason="the 'cluster' extra (ray[serve]) is not installed")
pytest.importorskip("ray.serve", reason="the 'cluster' extra (ray[serve]) is not installed")
psutil = pytest.importorskip("psutil", reason="ray[serve] installs psutil")

TOKEN = "test-token-0123456789"
WAIT_S = 60.0  # any single wait in these tests


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    from model_factory import write_random_model
    from kspec.engine.config import EngineConfig
    from kspec.engine.serve import cluster

    model = write_random_model(tmp_path_factory.mktemp("cluster-llama"), "llama", seed=0)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    cluster.start_ray(None, num_cpus=2)
    try:
        url = cluster.deploy(cluster.ClusterOptions(EngineConfig(model=str(model), progress=False), replicas=2, token=TOKEN, max_batch_requests=4), "127.0.0.1", 0)
        yield url
    finally:
        ray_processes = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
        cluster.undeploy(local=True)
        gone, alive = psutil.wait_procs(ray_processes, timeout=WAIT_S)
        for process in alive:
            process.kill()
        assert not alive, f"Ray left processes running: {[p.pid for p in alive]}"


def call(url: str, path: str, body: dict | None = None, token: str | None = TOKEN) -> tuple[int, dict, dict]:
    """-> (status, JSON body, headers)."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def complete(url: str, document: str | None, **fields) -> tuple[int, dict, str]:
    body = {"prompt": "def add(a, b):\n    return", "max_tokens": 4, "n": 2, "temperature": 0, **fields}
    if document is not None:
        body["user"] = document
    status, payload, headers = call(url, "/completions", body)
    return status, payload, headers.get("x-kspec-replica", "")


def test_token_is_required(served):
    status, payload, headers = call(served, "/models", token=None)
    assert status == 401 and payload["error"]["type"] == "authentication_error"
    assert headers.get("www-authenticate") == "Bearer"
    status, _, _ = complete_with_token(served, "wrong-token")
    assert status == 401


def complete_with_token(url: str, token: str) -> tuple[int, dict, dict]:
    return call(url, "/completions", {"prompt": "x = ", "max_tokens": 2}, token=token)


def test_models_and_errors(served):
    status, payload, _ = call(served, "/models")
    assert status == 200
    model = payload["data"][0]["id"]
    assert payload["object"] == "list" and model
    status, payload, _ = complete(served, "errors.py", n=0)
    assert status == 400 and payload["error"]["param"] == "n"
    status, payload, _ = complete(served, "errors.py", model="another-model")
    assert status == 404
    status, payload, _ = call(served.removesuffix("/v1"), "/nowhere")
    assert status == 404
    status, payload, _ = call(served.removesuffix("/v1"), "/health")
    assert (status, payload["status"]) == (200, "ready")
    status, payload, _ = call(served.removesuffix("/v1"), "/health", token=None)
    assert status == 401 and "status" not in payload  # nothing but a refusal without the token


def test_same_document_same_replica(served):
    answers = [complete(served, "affinity.py") for _ in range(4)]
    assert all(status == 200 and len(payload["choices"]) >= 1 for status, payload, _ in answers)
    replicas = {replica for _, _, replica in answers}
    assert len(replicas) == 1 and "" not in replicas


def test_documents_spread_over_replicas(served):
    documents = [f"spread-{index}.py" for index in range(6)]
    first = {document: complete(served, document)[2] for document in documents}
    assert len(set(first.values())) == 2, first
    again = {document: complete(served, document)[2] for document in documents}
    assert again == first


def test_requests_without_document_are_answered(served):
    for _ in range(3):
        status, payload, replica = complete(served, None)
        assert status == 200 and payload["choices"] and replica


def test_replica_killed_mid_request(served):
    from ray import serve

    from kspec.engine.serve import cluster

    document = "killed.py"
    status, _, home = complete(served, document)
    assert status == 200 and home
    engine = serve.get_deployment_handle(cluster.ENGINE_DEPLOYMENT, app_name=cluster.APP_NAME)

    outcome: dict = {}

    def long_request() -> None:
        # n=4 x 256 tokens takes seconds on these cores: long enough to kill the replica under it.
        outcome["answer"] = complete(served, document, n=4, max_tokens=256, kspec={"deadline_ms": 120000})

    worker = threading.Thread(target=long_request)
    worker.start()
    deadline = time.monotonic() + WAIT_S
    while True:  # until the long request runs on its replica (each probe is a round trip)
        info = engine.info.remote(replica=home).result(timeout_s=WAIT_S)
        assert info["replica"] == home
        if info["running"] >= 1:
            break
        assert time.monotonic() < deadline, "the long request never reached its replica"
    ray.kill(ray.get_actor(info["actor"], namespace=info["namespace"]), no_restart=True)
    worker.join(WAIT_S)
    assert not worker.is_alive()

    status, payload, answered_by = outcome["answer"]
    assert status == 200, payload
    assert len(payload["choices"]) >= 1
    assert answered_by and answered_by != home
    # The document now lives on the replica that took it over.
    for _ in range(2):
        status, _, replica = complete(served, document)
        assert (status, replica) == (200, answered_by)
