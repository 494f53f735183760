"""The Kubernetes manifests (deploy/k8s), rendered and checked against Kubernetes' schemas and paperlane's code.

No cluster runs where paperlane is developed, so this stands in for `kubectl apply`: every overlay is rendered with
`kubectl kustomize`, every object validated (strictly: unknown fields refused) against the schemas of a pinned
Kubernetes release that kubernetes-validate carries (offline), and KEDA's ScaledObject against the schema written
in deploy/k8s/schemas. Then, as tests/test_compose.py does for docker compose: every ``PAPERLANE_*`` variable is a
setting and the settings parse, every command and option is registered, every port and probe is one the code
serves, and no credential is in the manifests. Last, the autoscaler's signal: the exported backlog per lane equals
the pages really waiting in Redis (lane lists and fair-share sets), filled with real pages.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml
from fastapi.testclient import TestClient

from paperlane.models.profiles import PROFILES
from paperlane.priority.depth import METRIC, QueueDepth
from paperlane.priority.fair import FairLanes
from paperlane.priority.lanes import Lane, broker_keys
from paperlane.producer.api.app import create_app
from paperlane.settings import EngineKind, Settings, StorageBackend
from paperlane.workers.outputs_pool import output_processes
from paperlane.workers.outputs_service import METRIC as OUTPUTS_METRIC
from tests.code_names import command_problem, flags, unknown_setting
from tests.conftest import Stack
from tests.test_compose import argv as compose_argv
from tests.test_compose import service as compose_service
from tests.test_scheduling import Producer

pytestmark = pytest.mark.processes  # kubectl kustomize renders the manifests: not in the fast tier

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
KUBERNETES = "1.33.0"  # the release whose schemas the objects must satisfy (native sidecars are GA in it)
SECRET = "paperlane-secrets"
GUIDE = ROOT / "docs" / "operations.md"
# The Secret's keys (the variables it sets) with stand-in values, for building settings as a pod would.
SECRET_VALUES = {"PAPERLANE_DATABASE__URL": "postgresql+psycopg2://paperlane:pw@postgres:5432/paperlane",
                 "PAPERLANE_REDIS__URL": "redis://:pw@redis:6379/0", "PAPERLANE_STORAGE__ACCESS_KEY_ID": "key",
                 "PAPERLANE_STORAGE__SECRET_ACCESS_KEY": "secret"}


@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                         text=True, timeout=60, check=True)
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def objects(kind: str, overlay: str = "production") -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in rendered(overlay) if o["kind"] == kind}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"]["spec"])


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def paperlane_containers(overlay: str = "production") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container that runs paperlane's image, named ``object/container``."""
    for obj in rendered(overlay):
        if obj["kind"] in ("Deployment", "Job", "CronJob"):
            for c in containers(pod_spec(obj)):
                if "paperlane" in c["image"]:
                    yield f"{obj['metadata']['name']}/{c['name']}", c


def container(deployment: str, name: str) -> dict[str, Any]:
    [found] = [c for c in containers(pod_spec(objects("Deployment")[deployment])) if c["name"] == name]
    return found


def environment(c: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the pod gets it: the ConfigMap and the Secret it names, then its own."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        if "secretRef" in source:
            assert source["secretRef"]["name"] == SECRET
            env |= SECRET_VALUES
        else:
            env |= objects("ConfigMap")[source["configMapRef"]["name"]]["data"]
    return env | {var["name"]: str(var["value"]) for var in c.get("env", [])}


def settings_of(c: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key in [k for k in os.environ if k.upper().startswith("PAPERLANE_")]:
        monkeypatch.delenv(key)
    for key, value in environment(c).items():
        monkeypatch.setenv(key, value)
    return Settings()


def port_number(c: dict[str, Any], port: int | str) -> int:
    return port if isinstance(port, int) else next(p["containerPort"] for p in c["ports"] if p["name"] == port)


# --- schemas ----------------------------------------------------------------------------------------------------

@functools.cache
def keda_validator() -> jsonschema.Draft202012Validator:
    schema = yaml.safe_load((K8S / "schemas" / "scaledobject-keda-v1alpha1.yaml").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate(obj: dict[str, Any]) -> None:
    if obj["apiVersion"].startswith("keda.sh/"):
        keda_validator().validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_for_the_pinned_kubernetes(overlay: str) -> None:
    kinds = sorted(o["kind"] for o in rendered(overlay))
    assert kinds == ["ConfigMap", "CronJob", "Deployment", "Deployment", "Deployment", "Job", "NetworkPolicy",
                     "PodDisruptionBudget", "ScaledObject", "ScaledObject", "Service"]
    for obj in rendered(overlay):
        validate(obj)


def test_validation_refuses_what_a_cluster_would() -> None:
    api = objects("Deployment")["paperlane-api"]
    wrong_type = {**api, "spec": {**api["spec"], "replicas": "two"}}
    misspelt = {**api, "spec": {**api["spec"], "replica": 2}}
    scaled = objects("ScaledObject")["paperlane-gpu-worker"]
    unquoted = {**scaled, "spec": {**scaled["spec"], "triggers": [
        {**scaled["spec"]["triggers"][0], "metadata": {"query": "x", "threshold": 2000}}]}}
    no_target = {**scaled, "spec": {k: v for k, v in scaled["spec"].items() if k != "scaleTargetRef"}}
    typo = {**scaled, "spec": {**scaled["spec"], "cooldownPeriods": 300}}
    for bad in (wrong_type, misspelt, unquoted, no_target, typo):
        with pytest.raises(jsonschema.ValidationError):
            validate(bad)


def test_validation_is_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schemas are inside the kubernetes-validate wheel: the pinned release is among them, nothing is fetched."""
    assert KUBERNETES in kubernetes_validate.utils.all_versions()

    def refuse(*args: object) -> None:
        raise AssertionError(f"validation opened a connection to {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    for obj in rendered("production"):
        validate(obj)


# --- settings, commands, ports ------------------------------------------------------------------------------------

def test_every_paperlane_variable_is_a_setting() -> None:
    names = [(where, var) for where, c in paperlane_containers() for var in environment(c)]
    assert len(names) > 20
    assert [f"{where}: {why}" for where, var in names if (why := unknown_setting(var))] == []
    assert [n for n in names if not n[1].startswith("PAPERLANE_")] == [], "variables paperlane does not read"


@pytest.mark.parametrize("where", [w for w, _ in paperlane_containers()])
def test_settings_parse_in_every_container(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c = dict(paperlane_containers())[where]
    s = settings_of(c, monkeypatch)
    assert s.storage.backend is StorageBackend.S3 and s.database.url == SECRET_VALUES["PAPERLANE_DATABASE__URL"]


def test_no_credentials_in_the_manifests() -> None:
    assert objects("Secret") == {}, "the Secret is made beforehand, never in the manifests"
    for where, c in paperlane_containers():
        assert {"secretRef": {"name": SECRET}} in c["envFrom"], where
        own = {var["name"]: var["value"] for var in c.get("env", [])}  # values only: no secretKeyRef of its own
        assert not set(own) & set(SECRET_VALUES) and not any("@" in v or "TOKEN" in k for k, v in own.items())
    config = objects("ConfigMap")["paperlane-config"]["data"]
    assert not set(config) & set(SECRET_VALUES) and not any("@" in v for v in config.values())


def test_the_guide_makes_the_secret_the_pods_read() -> None:
    """docs/operations.md's `kubectl create secret` sets exactly the variables the test stands in for."""
    command = re.search(r"kubectl (?:-n \S+ )?create secret generic " + SECRET + r"(.*?)```", GUIDE.read_text(), re.S)
    assert command, "docs/operations.md: no `kubectl create secret generic paperlane-secrets`"
    assert sorted(re.findall(r"--from-literal=(\w+)=", command.group(1))) == sorted(SECRET_VALUES)


def _retention_registered() -> bool:
    return command_problem(["db", "retention"]) is None


@pytest.mark.parametrize("where", [w for w, _ in paperlane_containers()])
def test_commands_are_registered(where: str) -> None:
    args = dict(paperlane_containers())[where]["args"]
    if args == ["db", "retention"] and not _retention_registered():
        pytest.xfail("`paperlane db retention` is issue 27 item 4's, not merged into this branch yet")
    assert command_problem(args) is None
    assert "command" not in dict(paperlane_containers())[where], "the image's entrypoint is paperlane"


def test_each_part_runs_its_command() -> None:
    args = {where: c["args"] for where, c in paperlane_containers()}
    assert args == {"paperlane-migrate/migrate": ["db", "upgrade"], "paperlane-api/api": ["api"],
                    "paperlane-gpu-worker/worker": ["worker"], "paperlane-outputs/outputs": ["outputs"],
                    "paperlane-retention/retention": ["db", "retention"]}
    assert objects("CronJob")["paperlane-retention"]["spec"]["concurrencyPolicy"] == "Forbid"


def test_api_port_probes_and_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    c = container("paperlane-api", "api")
    s = settings_of(c, monkeypatch)
    assert s.api.host == "0.0.0.0" and port_number(c, "http") == s.api.port
    routes = set(create_app(s, webhooks=False).openapi()["paths"])
    probes = {kind: c[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    for probe in probes.values():
        assert probe["path"] in routes and port_number(c, probe["port"]) == s.api.port
    assert s.api.metrics_token is None, "/readyz would answer a probe 401"
    [svc] = objects("Service").values()
    pods = objects("Deployment")["paperlane-api"]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pods.items()
    assert [port_number(c, p["targetPort"]) for p in svc["spec"]["ports"]] == [s.api.port]


def test_the_api_keeps_a_replica_through_disruptions() -> None:
    api = objects("Deployment")["paperlane-api"]
    pdb = objects("PodDisruptionBudget")["paperlane-api"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    assert 1 <= pdb["spec"]["minAvailable"] < api["spec"]["replicas"]
    assert api["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_gpu_pod_is_one_vllm_and_its_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    pod = pod_spec(objects("Deployment")["paperlane-gpu-worker"])
    vllm, worker = container("paperlane-gpu-worker", "vllm"), container("paperlane-gpu-worker", "worker")
    assert [c["name"] for c in pod["initContainers"]] == ["vllm"] and vllm["restartPolicy"] == "Always"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert all("nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}) for c in pod["containers"])
    s = settings_of(worker, monkeypatch)
    serve = flags(vllm["args"])
    url = urlsplit(s.engine.url or "")
    assert s.engine.kind is EngineKind.VLLM
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", port_number(vllm, "vllm"), "/v1")
    assert int(serve["--port"]) == port_number(vllm, "vllm") and serve["--host"] == "0.0.0.0"
    assert s.engine.model == serve["--served-model-name"] and s.engine.profile in PROFILES
    # The window follows the server's /metrics (docs/engines.md), up to a cap that lets it fill the server.
    assert s.engine.window.adaptive and s.engine.max_in_flight >= 2 * int(serve["--max-num-seqs"])
    assert vllm["startupProbe"]["httpGet"]["path"] == "/health"
    assert port_number(worker, "metrics") == s.metrics.port == port_number(worker, worker["livenessProbe"][
        "httpGet"]["port"])
    assert "replicas" not in objects("Deployment")["paperlane-gpu-worker"]["spec"], "the ScaledObject owns it"


def test_vllm_serves_as_compose_does() -> None:
    """The same image and serving flags as docker-compose.yml's (tested there against the README), except the
    address and the share of GPU memory (a pod has its GPU to itself)."""
    vllm = container("paperlane-gpu-worker", "vllm")
    compose = compose_service("vllm")
    assert vllm["image"] == compose["image"] and vllm["command"] == compose["entrypoint"]
    ours, theirs = flags(vllm["args"]), flags(compose_argv(compose))
    differ = {"--host", "--gpu-memory-utilization"}
    assert {k: v for k, v in ours.items() if k not in differ} == {k: v for k, v in theirs.items() if k not in differ}
    assert vllm["args"][0] == compose_argv(compose)[0]  # the model folder, under the weights' mount
    assert vllm["args"][0].startswith("/models/") and environment(vllm)["HF_HUB_OFFLINE"] == "1"
    pod = pod_spec(objects("Deployment")["paperlane-gpu-worker"])
    [mount] = [m for m in vllm["volumeMounts"] if m["mountPath"] == "/models"]
    assert mount["readOnly"] and any(v["name"] == mount["name"] and v["persistentVolumeClaim"]["readOnly"]
                                     for v in pod["volumes"])


def test_grace_period_covers_the_workers_graceful_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    pod = pod_spec(objects("Deployment")["paperlane-gpu-worker"])
    s = settings_of(container("paperlane-gpu-worker", "worker"), monkeypatch)
    assert pod["terminationGracePeriodSeconds"] >= s.worker.shutdown_grace + 30  # and vLLM's stop after it


# --- autoscaling ------------------------------------------------------------------------------------------------

def scaled(overlay: str = "production") -> dict[str, Any]:
    return dict(objects("ScaledObject", overlay)["paperlane-gpu-worker"]["spec"])


def lane_weights(query: str) -> dict[str, int]:
    """``{lane: weight}`` of a query written ``W * max(METRIC{lane="L"} ...) + max(METRIC{lane="L2"} ...)``."""
    terms = re.findall(r'(?:(\d+)\s*\*\s*)?max\(\s*(\w+)\{lane="(\w+)"\}', query)
    assert terms and all(name == METRIC for _, name, _ in terms)
    return {lane: int(w or 1) for w, _, lane in terms}


def test_scaling_reads_the_backlog_of_every_lane_interactive_first() -> None:
    spec = scaled()
    assert spec["scaleTargetRef"]["name"] in objects("Deployment")
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    weights = lane_weights(trigger["metadata"]["query"])
    assert set(weights) == {lane.value for lane in Lane}
    assert weights[Lane.INTERACTIVE.value] > weights[Lane.BATCH.value]
    assert float(trigger["metadata"]["threshold"]) > 0 and "activationThreshold" in trigger["metadata"]


def test_scaling_down_waits_for_the_graceful_stop() -> None:
    spec = scaled()
    grace = pod_spec(objects("Deployment")["paperlane-gpu-worker"])["terminationGracePeriodSeconds"]
    assert spec["cooldownPeriod"] > grace
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert all(p["periodSeconds"] > grace for p in down["policies"]) and down["stabilizationWindowSeconds"] > grace


def test_document_outputs_are_the_cpu_pods_and_scale_on_what_is_due(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = settings_of(container("paperlane-gpu-worker", "worker"), monkeypatch)
    assert not gpu.worker.write_outputs and output_processes(gpu) == 0  # no output processes on the GPU pod
    cpu = settings_of(container("paperlane-outputs", "outputs"), monkeypatch)
    assert cpu.metrics.port == 9100 and (cpu.worker.output_processes or 0) >= 1
    pod = pod_spec(objects("Deployment")["paperlane-outputs"])
    assert "nvidia.com/gpu" not in str(pod) and not pod.get("tolerations")
    spec = dict(objects("ScaledObject")["paperlane-outputs"]["spec"])
    assert spec["scaleTargetRef"]["name"] == "paperlane-outputs" and spec["minReplicaCount"] >= 1
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and re.fullmatch(rf"max\({OUTPUTS_METRIC} or vector\(0\)\)",
                                                            trigger["metadata"]["query"])


def test_scale_to_zero_is_an_overlay() -> None:
    assert scaled("production")["minReplicaCount"] >= 1
    assert scaled("scale-to-zero")["minReplicaCount"] == 0
    assert scaled("scale-to-zero")["cooldownPeriod"] == scaled("production")["cooldownPeriod"]


def _exported(client: redis.Redis) -> dict[str, float]:
    [family] = QueueDepth(client).collect()
    return {s.labels["lane"]: s.value for s in family.samples}


def _waiting(client: redis.Redis, fair: FairLanes) -> dict[str, int]:
    """Pages really waiting per lane, counted one by one: every message in its buffer lists and fair-share sets."""
    return {lane.value: sum(int(client.llen(k)) for k in broker_keys(lane)) + len(fair.waiting(lane))
            for lane in Lane}


def test_exported_depth_is_the_real_backlog(stack_factory: Callable[..., Stack]) -> None:
    stack = stack_factory()
    producer = Producer(stack)
    batch = producer.submit(range(40), Lane.BATCH) + producer.submit(range(100, 125), Lane.BATCH, level=3)
    interactive = producer.submit(range(200, 207), Lane.INTERACTIVE)
    client = stack.broker()  # its keys under the stack's redis.key_prefix
    fair = FairLanes(client, buffer=stack.settings.fair_share.buffer)
    try:
        assert len(fair.waiting(Lane.BATCH)) > 0, "the pages must wait mostly by fair share, not in the buffer"
        assert _waiting(client, fair) == {"batch": len(batch), "interactive": len(interactive)}
        assert _exported(client) == _waiting(client, fair)
        for _ in range(5):  # a worker's pops: a message leaves the buffer, the refill moves the next one up
            client.brpop(broker_keys(Lane.BATCH), timeout=1)
            fair.refill(Lane.BATCH)
        assert _exported(client) == _waiting(client, fair) == {"batch": len(batch) - 5, "interactive": 7}
        with TestClient(create_app(stack.settings, webhooks=False)) as api:  # what a fleet at zero is woken by
            text = api.get("/metrics").text
        assert f'{METRIC}{{lane="batch"}} {len(batch) - 5}.0' in text
        assert f'{METRIC}{{lane="interactive"}} 7.0' in text
    finally:
        client.close()
