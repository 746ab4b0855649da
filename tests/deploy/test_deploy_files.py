"""The deployment files: Dockerfile, deploy/docker-compose.yml, deploy/k8s/, Grafana provisioning.

No Docker engine or cluster runs here, so the files are checked as files: the compose file by
``docker-compose config`` (Debian's v1.29 needs no engine) when it is installed, and always
structurally with PyYAML; the Kubernetes manifests structurally (and against the API schemas
when ``kubernetes-validate`` is installed); every ``backburner`` command line in them against
the real CLI; and the health checks by running them against a real API and worker.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from backburner.observability.metrics import Metrics
from backburner.settings import Settings

from ..helpers import free_port

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
GRAFANA_PROVISIONING = DEPLOY / "grafana" / "provisioning"

BACKBURNER_SERVICES = ("api", "worker-1", "worker-2")
SETTING_VARS = {f"BACKBURNER_{f.name.upper()}" for f in fields(Settings)}
CLI_VARS = {"BACKBURNER_LOG_FORMAT", "BACKBURNER_URL"}
"""BACKBURNER_* variables the CLI reads itself (not Settings fields)."""


# -- the real CLI ---------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [sys.executable, "-m", "backburner", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


@functools.cache
def cli_commands() -> frozenset[str]:
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    names = re.findall(r"^\W*([a-z][a-z-]+)\s{2,}\S", result.stdout.split("Commands", 1)[1], re.M)
    assert {"api", "worker", "serve"} <= set(names), result.stdout
    return frozenset(names)


@functools.cache
def cli_options(command: str) -> dict[str, str]:
    """``--option`` -> its value type (``int``, ``str``, ``bool``) from ``backburner CMD
    --help``."""
    result = _cli(command, "--help")
    assert result.returncode == 0, result.stderr
    found = re.findall(r"^\W*(--[a-z][a-z0-9-]*)(?:\s+-[a-zA-Z])?\s+<(\w+)>", result.stdout, re.M)
    assert found, f"no options read from `backburner {command} --help`:\n{result.stdout}"
    return dict(found)


def check_backburner_argv(argv: list[str]) -> None:
    """``argv`` is a command line the ``backburner`` CLI accepts: a real subcommand, real
    options with values of the right type. (Click rejects unknown options even with --help.)"""
    assert argv[0] == "backburner", argv
    assert len(argv) >= 2 and argv[1] in cli_commands(), f"not a backburner command: {argv}"
    options = cli_options(argv[1])
    rest = argv[2:]
    for i, token in enumerate(rest):
        if not token.startswith("--"):
            continue
        name, _, inline = token.partition("=")
        assert name in options, f"{argv[1]} has no option {name} (it has {sorted(options)})"
        if options[name] != "bool":
            value = inline or (rest[i + 1] if i + 1 < len(rest) else "")
            assert value and not value.startswith("--"), f"{name} needs a value in {argv}"
            if options[name] == "int":
                assert value.isdigit(), f"{name} takes an integer, got {value!r}"
    result = _cli(*argv[1:], "--help")
    assert result.returncode == 0, f"`{shlex.join(argv)} --help` failed:\n{result.stderr}"


def option_value(argv: list[str], name: str) -> str | None:
    for i, token in enumerate(argv):
        if token == name and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None


def check_backburner_env(env: dict[str, str]) -> Settings:
    """Every BACKBURNER_* name is a real setting, and the values make valid Settings."""
    unknown = {k for k in env if k.startswith("BACKBURNER_")} - SETTING_VARS - CLI_VARS
    assert not unknown, f"not backburner settings: {sorted(unknown)}"
    return Settings.from_env({k: v for k, v in env.items() if k in SETTING_VARS})


def test_cli_help_is_read() -> None:
    assert {"--backend", "--host", "--port"} <= set(cli_options("api"))
    assert cli_options("worker")["--metrics-port"] == "int"


def test_a_bad_command_line_is_caught() -> None:
    with pytest.raises(AssertionError):
        check_backburner_argv(["backburner", "worker", "--metrics-prot", "9101"])
    with pytest.raises(AssertionError):
        check_backburner_argv(["backburner", "api", "--port", "http"])
    with pytest.raises(AssertionError):
        check_backburner_argv(["backburner", "wrker"])


# -- docker-compose -------------------------------------------------------------------------

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``, for the fallback."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        current = env.get(name)
        unset = current is None or (op is not None and op.startswith(":") and current == "")
        if op is not None and op.endswith("?") and unset:
            raise AssertionError(f"compose needs {name}: {arg}")
        if op is not None and op.endswith("-") and unset:
            return arg
        return current or ""

    return _INTERPOLATION.sub(one, value)


def compose_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "BACKBURNER_API_KEYS": "demo:bb_compose-test-key",  # the compose file requires keys
    }


def load_compose(env: dict[str, str], loader: str) -> dict[str, Any]:
    """The compose model as ``docker-compose config`` prints it (interpolated, merged, paths
    made absolute), or as PyYAML reads it (anchors and ``<<`` merged) with our interpolation:
    the fallback where docker-compose is not installed."""
    if loader == "docker-compose":
        result = subprocess.run(
            ["docker-compose", "-f", str(COMPOSE_FILE), "config"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return yaml.safe_load(result.stdout)
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return interpolate({k: v for k, v in raw.items() if not k.startswith("x-")}, env)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    if isinstance(test, str):
        return ["/bin/sh", "-c", test]
    assert test[0] in ("CMD", "CMD-SHELL"), test
    return [str(t) for t in test[1:]] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]


def seconds(duration: str | int | float) -> float:
    if isinstance(duration, int | float):
        return float(duration)
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration):
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
    assert total or duration in ("0", "0s"), f"not a duration: {duration!r}"
    return total


def published_ports(service: dict[str, Any]) -> set[int]:
    ports: set[int] = set()
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports.add(int(port["published"]))
        else:
            ports.add(int(str(port).split("/")[0].rsplit(":", 2)[-2]))
    return ports


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path resolved against deploy/, container path) of each bind mount."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") != "bind":
                continue
            source, target = volume["source"], volume["target"]
        else:
            source, target = volume.split(":")[:2]
            if not source.startswith((".", "/")):
                continue  # a named volume
        mounts.append(((DEPLOY / source).resolve(), target))
    return mounts


def named_volumes(service: dict[str, Any]) -> list[str]:
    names = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "volume":
                names.append(volume["source"])
        elif not volume.startswith((".", "/")) and ":" in volume:
            names.append(volume.split(":")[0])
    return names


@pytest.fixture(
    scope="module",
    params=[
        ("docker-compose", False),
        ("docker-compose", True),
        ("pyyaml", False),
        ("pyyaml", True),
    ],
    ids=["docker-compose", "docker-compose-secret", "pyyaml", "pyyaml-secret"],
)
def compose(request: pytest.FixtureRequest) -> dict[str, Any]:
    loader, with_secret = request.param
    if loader == "docker-compose" and not shutil.which("docker-compose"):
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    env = compose_env()
    if with_secret:
        from backburner.webhooks import generate_secret

        env["BACKBURNER_WEBHOOK_SECRET"] = generate_secret()
    model = load_compose(env, loader)
    model["_env"] = env
    return model


def test_docker_compose_config_is_valid() -> None:
    """Debian's docker-compose (v1.29) validates against the compose schema without an engine;
    the ``docker compose`` plugin is used too where it runs."""
    env = compose_env()
    ran = []
    if shutil.which("docker-compose"):
        result = subprocess.run(
            ["docker-compose", "-f", str(COMPOSE_FILE), "config", "-q"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        ran.append("docker-compose")
    if shutil.which("docker"):
        plugin = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if plugin.returncode == 0:
            result = subprocess.run(
                ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert result.returncode == 0, result.stderr
            ran.append("docker compose")
    if not ran:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")


def test_compose_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {*BACKBURNER_SERVICES, "redis", "prometheus", "grafana"}
    assert 8000 in published_ports(services["api"])
    assert 9090 in published_ports(services["prometheus"])
    assert 3000 in published_ports(services["grafana"])
    for name in BACKBURNER_SERVICES:
        assert services[name]["image"] == services["api"]["image"]
        assert services[name]["build"]["dockerfile"] == "Dockerfile"


def test_compose_backburner_commands(compose: dict[str, Any]) -> None:
    services = compose["services"]
    api = command(services["api"])
    check_backburner_argv(api)
    assert api[1] == "api" and option_value(api, "--host") == "0.0.0.0"
    assert option_value(api, "--port") in (None, "8000")
    for name in ("worker-1", "worker-2"):
        argv = command(services[name])
        check_backburner_argv(argv)
        assert argv[1] == "worker"
        assert option_value(argv, "--metrics-port") == "9101"
        assert option_value(argv, "--host") == "0.0.0.0"


def test_compose_environment(compose: dict[str, Any]) -> None:
    secret = compose["_env"].get("BACKBURNER_WEBHOOK_SECRET")
    for name in BACKBURNER_SERVICES:
        env = environment(compose["services"][name])
        settings = check_backburner_env(env)
        assert settings.backend_url == "redis://redis:6379/0"
        assert settings.webhook_secret == secret  # passed through; unset: None, webhooks off


def test_compose_redis_is_durable(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert str(redis["image"]).startswith("redis:7")
    argv = command(redis)
    assert option_value(argv, "--appendonly") == "yes"
    assert option_value(argv, "--appendfsync") == "everysec"
    assert any(
        v.endswith(":/data") or ":/data:" in v for v in redis["volumes"] if isinstance(v, str)
    )


def test_compose_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in named_volumes(service):
            assert volume in declared, f"{name} uses undeclared volume {volume}"


def test_compose_mounts(compose: dict[str, Any]) -> None:
    """Every bind mount comes from deploy/; our own files exist; the Prometheus config and the
    dashboard JSON are another change's, so only their place is checked until they exist."""
    own = {GRAFANA_PROVISIONING / "datasources", GRAFANA_PROVISIONING / "dashboards"}
    mounts = {}
    for service in compose["services"].values():
        for source, target in bind_mounts(service):
            assert source.is_relative_to(DEPLOY.resolve()), f"{source} is outside deploy/"
            mounts[source.relative_to(DEPLOY.resolve()).as_posix()] = target
            if source in own:
                assert source.is_dir(), source
            elif source.exists():
                assert source.is_file(), f"{source} should be a file"
    assert mounts["prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["prometheus/alerts.yml"] == "/etc/prometheus/alerts.yml"
    assert mounts["grafana/provisioning/datasources"] == "/etc/grafana/provisioning/datasources"
    assert mounts["grafana/provisioning/dashboards"] == "/etc/grafana/provisioning/dashboards"
    assert mounts["grafana/backburner.json"].startswith(dashboards_path() + "/")


def test_compose_healthchecks_and_depends_on(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has no healthcheck"
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], dependency
    for name in BACKBURNER_SERVICES:
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert services[name]["restart"] == "unless-stopped"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_compose_workers_outlast_the_shutdown_grace(compose: dict[str, Any]) -> None:
    """Docker's default 10 s before SIGKILL would cut a worker's graceful shutdown short."""
    for name in ("worker-1", "worker-2"):
        service = compose["services"][name]
        grace = check_backburner_env(environment(service)).shutdown_grace_s
        assert seconds(service.get("stop_grace_period", "10s")) > grace
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_prometheus_config_scrapes_the_compose_services() -> None:
    config_file = DEPLOY / "prometheus" / "prometheus.yml"
    if not config_file.exists():
        pytest.skip("deploy/prometheus/prometheus.yml is not written yet")
    config = yaml.safe_load(config_file.read_text())
    targets = {
        target
        for job in config.get("scrape_configs", [])
        for static in job.get("static_configs", [])
        for target in static.get("targets", [])
    }
    assert {"api:8000", "worker-1:9101", "worker-2:9101"} <= targets, targets
    for rule_file in config.get("rule_files", []):
        assert Path(rule_file).name == "alerts.yml" or (DEPLOY / "prometheus" / rule_file).exists()


# -- Grafana provisioning -------------------------------------------------------------------


def dashboards_path() -> str:
    provider = yaml.safe_load((GRAFANA_PROVISIONING / "dashboards" / "backburner.yml").read_text())
    (only,) = provider["providers"]
    return str(only["options"]["path"]).rstrip("/")


def test_grafana_datasource() -> None:
    config = yaml.safe_load((GRAFANA_PROVISIONING / "datasources" / "prometheus.yml").read_text())
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert source["uid"] == "prometheus"
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert source["access"] == "proxy"


def test_grafana_dashboard_provider() -> None:
    config = yaml.safe_load((GRAFANA_PROVISIONING / "dashboards" / "backburner.yml").read_text())
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    assert dashboards_path().startswith("/")  # where the compose file mounts the JSON


def test_dashboard_uses_the_provisioned_datasource() -> None:
    dashboard_file = DEPLOY / "grafana" / "backburner.json"
    if not dashboard_file.exists():
        pytest.skip("deploy/grafana/backburner.json is not written yet")
    uids = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            source = node.get("datasource")
            if isinstance(source, dict) and isinstance(source.get("uid"), str):
                uids.add(source["uid"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(dashboard_file.read_text()))
    # "prometheus", or a variable (${DS_PROMETHEUS}: the default Prometheus), or Grafana's own
    builtin = "-- Grafana --"
    assert all(uid in ("prometheus", builtin) or uid.startswith("$") for uid in uids), uids


# -- Kubernetes -----------------------------------------------------------------------------


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict[str, Any]]:
    by_kind_name = {}
    for filename, doc in k8s_documents():
        for key in ("apiVersion", "kind", "metadata"):
            assert key in doc, f"{filename}: a document has no {key}"
        name = doc["metadata"].get("name")
        assert name and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), (filename, name)
        assert (doc["kind"], name) not in by_kind_name, f"two {doc['kind']} named {name}"
        by_kind_name[(doc["kind"], name)] = doc
    return by_kind_name


def one(k8s: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    assert (kind, name) in k8s, f"no {kind} {name} in deploy/k8s/"
    return k8s[(kind, name)]


def test_k8s_kinds(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    api_versions = {
        "Deployment": "apps/v1",
        "Service": "v1",
        "ConfigMap": "v1",
        "Secret": "v1",
        "PodDisruptionBudget": "policy/v1",
        "ScaledObject": "keda.sh/v1alpha1",
    }
    for (kind, name), doc in k8s.items():
        assert kind in api_versions, f"unexpected kind {kind} ({name})"
        assert doc["apiVersion"] == api_versions[kind], (kind, name)
    assert set(api_versions) == {kind for kind, _ in k8s}


def test_k8s_against_the_api_schemas() -> None:
    """Strict schema validation (unknown fields fail) where kubernetes-validate is installed;
    KEDA's ScaledObject has no schema there and is checked by hand below."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    checked = 0
    for filename, doc in k8s_documents():
        if doc["kind"] == "ScaledObject":
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{filename} {doc['kind']}/{doc['metadata']['name']}: {exc.message}")
        checked += 1
    assert checked >= 6


def test_k8s_deployments(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    configmaps = {name for kind, name in k8s if kind == "ConfigMap"}
    secrets = {name for kind, name in k8s if kind == "Secret"}
    deployments = {name: doc for (kind, name), doc in k8s.items() if kind == "Deployment"}
    assert set(deployments) == {"backburner-api", "backburner-worker"}
    for name, deployment in deployments.items():
        spec = deployment["spec"]
        labels = spec["template"]["metadata"]["labels"]
        selector = spec["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), f"{name}: selector does not match its pods"
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            check_backburner_argv([*container.get("command", []), *container["args"]])
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets
            port_names = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str):
                    assert port in port_names, f"{name}: {probe} names no port {port}"


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def test_k8s_api(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = one(k8s, "Deployment", "backburner-api")
    api = container(deployment)
    argv = [*api["command"], *api["args"]]
    assert argv[1] == "api" and option_value(argv, "--host") == "0.0.0.0"
    port = int(option_value(argv, "--port") or Settings().port)
    ports = {p["name"]: p["containerPort"] for p in api["ports"]}
    assert ports["http"] == port
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    service = one(k8s, "Service", "backburner-api")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {"http", port}


def settings_from_k8s(k8s: dict[tuple[str, str], dict[str, Any]]) -> Settings:
    env = dict(one(k8s, "ConfigMap", "backburner-config")["data"])
    env.update(one(k8s, "Secret", "backburner-secrets").get("stringData", {}))
    return check_backburner_env(env)


def test_k8s_settings_are_valid(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    settings = settings_from_k8s(k8s)
    assert settings.backend_url.startswith(("redis://", "rediss://"))


def test_k8s_worker(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = one(k8s, "Deployment", "backburner-worker")
    worker = container(deployment)
    argv = [*worker["command"], *worker["args"]]
    assert argv[1] == "worker"
    assert option_value(argv, "--host") == "0.0.0.0"
    metrics_port = option_value(argv, "--metrics-port")
    assert metrics_port is not None
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports["metrics"] == int(metrics_port)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == metrics_port
    # (/healthz, not /metrics: only it sees an event loop that a handler blocks)
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    pod = deployment["spec"]["template"]["spec"]
    grace = settings_from_k8s(k8s).shutdown_grace_s
    assert pod["terminationGracePeriodSeconds"] > grace + 5, "SIGKILL before the grace ends"


def test_k8s_worker_disruption_budget(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    budget = one(k8s, "PodDisruptionBudget", "backburner-worker")
    labels = one(k8s, "Deployment", "backburner-worker")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert ("maxUnavailable" in budget["spec"]) != ("minAvailable" in budget["spec"])


def test_k8s_keda_scales_the_worker_on_the_work_it_could_do_now(
    k8s: dict[tuple[str, str], dict[str, Any]],
) -> None:
    scaled = one(k8s, "ScaledObject", "backburner-worker")
    target = scaled["spec"]["scaleTargetRef"]
    assert target["name"] == "backburner-worker"
    assert target.get("kind", "Deployment") == "Deployment"
    assert target.get("apiVersion", "apps/v1") == "apps/v1"
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    # Due and processing: delayed jobs and retries in backoff ask for no worker.
    assert metadata["query"] == (
        'max(backburner_jobs_due) + max(backburner_jobs{status="processing"})'
    )
    assert metadata["serverAddress"].startswith("http")
    assert isinstance(metadata["threshold"], str)  # KEDA's metadata values are strings
    assert float(metadata["threshold"]) == settings_from_k8s(k8s).concurrency
    rendered = Metrics().render()
    assert b"\nbackburner_jobs_due " in rendered
    assert b"# TYPE backburner_jobs gauge" in rendered  # (no sample yet: no status seen)


# -- Dockerfile -----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        if text:
            keyword, _, rest = text.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def exec_form(arguments: str) -> list[str]:
    argv = json.loads(arguments)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), arguments
    return argv


def dockerfile_healthcheck() -> list[str]:
    (healthcheck,) = [args for keyword, args in final_stage() if keyword == "HEALTHCHECK"]
    flags, _, cmd = healthcheck.partition("CMD ")
    assert cmd, "HEALTHCHECK needs a CMD"
    assert "--interval" in flags and "--timeout" in flags
    return exec_form(cmd)


def test_dockerfile_base_image() -> None:
    instructions = dockerfile_instructions()
    args = {}
    for keyword, rest in instructions:
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args.setdefault(name, value)
    images = [
        re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
        for keyword, rest in instructions
        if keyword == "FROM"
    ]
    assert images and all(image == "python:3.11-slim" for image in images), images


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [rest for keyword, rest in final_stage() if keyword == "USER"]
    assert users, "the image runs as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit(), "a numeric uid lets Kubernetes' runAsNonRoot check it"
    k8s_uids = {
        doc["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        for _, doc in k8s_documents()
        if doc["kind"] == "Deployment"
    }
    assert k8s_uids == {int(user)}


def test_dockerfile_installs_redis_and_otel_and_local_only_on_request() -> None:
    text = DOCKERFILE.read_text()
    args = [rest for keyword, rest in dockerfile_instructions() if keyword == "ARG"]
    assert "LOCAL=0" in args
    runs = [rest for keyword, rest in dockerfile_instructions() if keyword == "RUN"]
    installs = [run for run in runs if "pip install" in run]
    assert any(
        'extras="redis,otel"' in run and 'extras="redis,otel,local"' in run for run in installs
    )
    for run in runs:
        if "build-essential" in run or "cmake" in run:
            assert '"$LOCAL" = "1"' in run, "compilers only for LOCAL=1"
    assert "EXPOSE 8000" in text


def test_dockerfile_healthcheck() -> None:
    argv = dockerfile_healthcheck()
    assert argv[:2] == ["python", "-c"]
    compile(argv[2], "<HEALTHCHECK>", "exec")
    assert "/healthz" in argv[2] and "urllib" in argv[2]


def test_dockerfile_cmd_is_a_backburner_command() -> None:
    cmds = [rest for keyword, rest in final_stage() if keyword == "CMD"]
    assert cmds, "no CMD"
    argv = exec_form(cmds[-1])  # exec form: PID 1 is backburner and gets SIGTERM
    check_backburner_argv(argv)
    assert argv[1:] == ["api", "--host", "0.0.0.0"]
    assert not [rest for keyword, rest in final_stage() if keyword == "ENTRYPOINT"]


def dockerignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        candidates = {pattern, pattern.removeprefix("**/")}
        if any(fnmatch(path, p) or path.startswith(p + "/") for p in candidates):
            ignored = not negate
    return ignored


def test_dockerignore() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for kept in ("pyproject.toml", "README.md", "backburner", "backburner/cli/main.py"):
        assert not dockerignored(kept, patterns), f"{kept} is needed by the image"
    for dropped in (".venv", ".git", ".mypy_cache", ".pytest_cache", "tests", "x/__pycache__"):
        assert dockerignored(dropped, patterns), f"{dropped} should stay out of the context"
    for keyword, rest in dockerfile_instructions():
        if keyword == "COPY" and "--from" not in rest:
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert not dockerignored(source, patterns), f"COPY {source} but it is ignored"


# -- the health checks, run against a real API and worker -----------------------------------


@contextmanager
def running(argv: list[str], env: dict[str, str], cwd: Path, url: str) -> Iterator[None]:
    """``argv`` (a backburner command line) running until ``url`` answers; SIGTERM on exit,
    which must end it gracefully (exit 0)."""
    log = cwd / f"{argv[1]}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "backburner", *argv[1:]],
            env={**os.environ, **env},
            cwd=cwd,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"{shlex.join(argv)} exited: {log.read_text()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{url} did not answer within 30 s")
                time.sleep(0.1)
        yield
        process.send_signal(signal.SIGTERM)
        # uvicorn re-raises the SIGTERM once it has shut down gracefully
        assert process.wait(timeout=30) in (0, -signal.SIGTERM), log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def run_healthcheck(argv: list[str], url: str) -> int:
    assert argv[0] == "python"
    result = subprocess.run(
        [sys.executable, *argv[1:]],
        env={**os.environ, "HEALTHCHECK_URL": url},
        capture_output=True,
        timeout=30,
    )
    return result.returncode


def swap(argv: list[str], old: str, new: str) -> list[str]:
    return [new if token == old else token for token in argv]


@pytest.mark.slow
def test_image_healthcheck_against_the_image_cmd(tmp_path: Path) -> None:
    """The Dockerfile's CMD (on loopback and a free port) passes the Dockerfile's HEALTHCHECK;
    a stopped API fails it."""
    (cmd,) = [rest for keyword, rest in final_stage() if keyword == "CMD"]
    argv = swap(exec_form(cmd), "0.0.0.0", "127.0.0.1")
    port = free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    env = {"BACKBURNER_PORT": str(port), "BACKBURNER_BACKEND_URL": f"sqlite:///{tmp_path}/a.db"}
    healthcheck = dockerfile_healthcheck()
    with running(argv, env, tmp_path, url):
        assert run_healthcheck(healthcheck, url) == 0
    assert run_healthcheck(healthcheck, url) != 0


def test_the_image_cmd_as_written_refuses_to_serve_without_keys(tmp_path: Path) -> None:
    """On 0.0.0.0, as the image runs it, the API needs keys (compose and k8s provide them)."""
    (cmd,) = [rest for keyword, rest in final_stage() if keyword == "CMD"]
    argv = exec_form(cmd)
    assert "0.0.0.0" in argv
    done = subprocess.run(
        [sys.executable, "-m", *argv[argv.index("backburner") :]],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "BACKBURNER_BACKEND_URL": f"sqlite:///{tmp_path}/a.db",
        },
    )
    assert done.returncode == 2 and "without API keys" in done.stderr, done.stderr
    api = load_compose(compose_env(), "pyyaml")["services"]["api"]
    assert environment(api)["BACKBURNER_API_KEYS"] == "demo:bb_compose-test-key"
    with pytest.raises(AssertionError, match="BACKBURNER_API_KEYS"):
        load_compose({k: v for k, v in compose_env().items() if "KEYS" not in k}, "pyyaml")


@pytest.mark.slow
def test_compose_worker_healthcheck_against_a_worker(tmp_path: Path) -> None:
    """A compose worker's command (on loopback and a free metrics port) passes its healthcheck,
    and SIGTERM ends it with exit 0."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    service = raw["services"]["worker-1"]
    port = free_port()
    argv = swap(swap(command(service), "0.0.0.0", "127.0.0.1"), "9101", str(port))
    url = f"http://127.0.0.1:{port}/healthz"
    assert environment(service)["HEALTHCHECK_URL"] == "http://127.0.0.1:9101/healthz"
    env = {"BACKBURNER_BACKEND_URL": f"sqlite:///{tmp_path}/w.db"}
    with running(argv, env, tmp_path, url):
        assert run_healthcheck(healthcheck_argv(service), url) == 0
