"""The Grafana dashboard and the Prometheus rules query only what backburner exports.

Every PromQL expression in deploy/grafana/backburner.json, deploy/prometheus/alerts.yml and
the series of its promtool unit tests is checked against ``Metrics().registry``: each
``backburner_*`` name must be a sample the service exports, each label used in a selector or
in ``by (...)`` must be one of that metric's labels, counters and histograms must go through
``rate``/``increase`` and then ``sum`` (they are per process), and the deployment-wide gauges
through ``max`` (every process reports the same value). promtool, when installed, checks the
files and runs the alerts' unit tests; under CI=true it must be installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from backburner.observability.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "backburner.json"
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERT_TESTS = PROMETHEUS / "alerts.test.yml"
CONFIG = PROMETHEUS / "prometheus.yml"

METRIC = re.compile(r"\bbackburner_[a-z_]+\b")
SELECTOR = re.compile(r"\b(backburner_[a-z_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(\s*(backburner_[a-z_]+)\s*,\s*([a-zA-Z_]\w*)\s*\)")
LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_]\w*)\s*\}\}")
TARGET_LABELS = frozenset({"job", "instance"})  # added by Prometheus to every series

RATES = {"rate", "irate", "increase"}
GAUGE_AGGREGATIONS = {"max", "absent"}

ALERT_KINDS = {
    "BackburnerTaskFailureRateHigh",
    "BackburnerQueueLatencyHigh",
    "BackburnerDeadLetterGrowing",
    "BackburnerNoActiveWorkers",
    "BackburnerWebhookDeliveriesFailing",
}
# What the dashboard must show (the brief of each panel is its title and description).
DASHBOARD_METRICS = {
    "backburner_queue_depth",
    "backburner_jobs_in_flight",
    "backburner_task_queue_latency_seconds_bucket",
    "backburner_task_duration_seconds_bucket",
    "backburner_tasks_completed_total",
    "backburner_tasks_failed_total",
    "backburner_task_retries_total",
    "backburner_dead_letter_jobs",
    "backburner_active_workers",
    "backburner_webhook_deliveries_total",
    "backburner_webhook_delivery_seconds_bucket",
    "backburner_webhook_messages",
    "backburner_llm_output_tokens_total",
    "backburner_llm_cost_usd_total",
    "backburner_llm_time_to_first_token_seconds_bucket",
}


@dataclass(frozen=True)
class Sample:
    """One exported sample name: its family's type and the labels it carries."""

    family: str
    kind: str  # counter, histogram, gauge
    labels: frozenset[str]


@cache
def exported() -> dict[str, Sample]:
    """Every sample name the service exports, from a fresh ``Metrics`` registry."""
    metrics = Metrics()
    families = {family.name: family.type for family in metrics.registry.collect()}
    labels = {family.name: frozenset(family.labelnames) for family in metrics.families}
    assert labels.keys() == families.keys(), "the registry exports a metric Metrics does not name"
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",)}
    suffixes["histogram"] = ("_bucket", "_count", "_sum", "_created")
    samples: dict[str, Sample] = {}
    for name, kind in families.items():
        for suffix in suffixes[kind]:
            extra = {"le"} if suffix == "_bucket" else set()
            samples[name + suffix] = Sample(name, kind, labels[name] | extra)
    return samples


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels inside a collapsed row
    return out


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def promql() -> dict[str, str]:
    """Every PromQL expression of the dashboard and the alerts, by where it is."""
    exprs = {
        f"panel {panel['title']} {target['refId']}": target["expr"]
        for panel in panels(dashboard())
        for target in panel.get("targets", [])
    }
    exprs.update({f"alert {rule['alert']}": rule["expr"] for rule in rules()})
    return exprs


def variable_queries() -> list[str]:
    """The dashboard's variable queries (``label_values(metric, label)``)."""
    out = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out.append(query["query"] if isinstance(query, dict) else query)
    return out


def alert_test_series() -> list[str]:
    doc = yaml.safe_load(ALERT_TESTS.read_text())
    return [s["series"] for test in doc["tests"] for s in test["input_series"]]


def in_prefix(prefix: str) -> list[str]:
    return [expr for where, expr in promql().items() if where.startswith(prefix)]


EXPRS = [pytest.param(expr, id=where) for where, expr in promql().items()]


def strip_strings(expr: str) -> str:
    """The expression with the insides of its string literals blanked (same length)."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: '"' + " " * (len(m[0]) - 2) + '"', expr)


def group_start(expr: str, close: int) -> int:
    """Index of the ``(`` matching the ``)`` at ``close``."""
    depth = 0
    for i in range(close, -1, -1):
        depth += {")": 1, "(": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses in {expr!r}")


def group_end(expr: str, open_: int) -> int:
    """Index of the ``)`` matching the ``(`` at ``open_``."""
    depth = 0
    for i in range(open_, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses in {expr!r}")


def enclosing_call(expr: str, pos: int) -> tuple[str, int]:
    """The function or aggregation whose parentheses hold ``pos``, and where its name starts.

    ``sum by (le) (rate(x[5m]))`` gives ``rate`` for ``x`` and ``sum`` for ``rate``; a bare
    grouping parenthesis gives "".
    """
    depth = 0
    for i in range(pos - 1, -1, -1):
        if expr[i] == ")":
            depth += 1
        elif expr[i] == "(":
            if depth:
                depth -= 1
                continue
            head = expr[:i].rstrip()
            if head.endswith(")"):  # `sum by (...) (` : skip the grouping clause
                head = expr[: group_start(expr, len(head) - 1)].rstrip()
                head = re.sub(r"\b(?:by|without)$", "", head).rstrip()
            name = re.search(r"[a-zA-Z_]\w*$", head)
            return (name[0], name.start()) if name else ("", i)
    return "", 0


def test_dashboard_is_grafana_json() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels(board):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        xs = range(pos["x"], pos["x"] + pos["w"])
        mine = {(x, y) for x in xs for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, f"panel {panel['title']!r} overlaps another"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for source in [panel["datasource"]] + [t["datasource"] for t in panel["targets"]]:
            assert source == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]


def test_dashboard_shows_every_topic() -> None:
    used = {name for expr in in_prefix("panel ") for name in METRIC.findall(expr)}
    assert not DASHBOARD_METRICS - used


@pytest.mark.parametrize("source", ["dashboard", "alerts", "alert tests"])
def test_every_metric_is_exported(source: str) -> None:
    exprs = {
        "dashboard": lambda: in_prefix("panel ") + variable_queries(),
        "alerts": lambda: in_prefix("alert "),
        "alert tests": alert_test_series,
    }[source]()
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert used, f"no backburner metric in the {source}"
    assert not used - exported().keys(), "not exported by backburner.observability.metrics"


@pytest.mark.parametrize(
    "expr",
    EXPRS
    + [pytest.param(q, id=f"variable {q}") for q in variable_queries()]
    + [pytest.param(s, id=f"alert test series {s}") for s in alert_test_series()],
)
def test_selector_labels_exist(expr: str) -> None:
    for name, matchers in SELECTOR.findall(expr):
        for label in MATCHER.findall(matchers):
            assert label in exported()[name].labels | TARGET_LABELS, f"{name} has no {label!r}"
    for name, label in LABEL_VALUES.findall(expr):
        assert label in exported()[name].labels, f"{name} has no {label!r}"


@pytest.mark.parametrize("expr", EXPRS)
def test_grouping_labels_exist(expr: str) -> None:
    code = strip_strings(expr)
    for match in GROUPING.finditer(code):
        labels = {label.strip() for label in match[1].split(",") if label.strip()}
        after = code[match.end() :].lstrip()
        if after.startswith("("):  # sum by (x) (expr)
            start = code.index("(", match.end())
            scope = code[start : group_end(code, start) + 1]
        else:  # sum(expr) by (x)
            end = code[: match.start()].rstrip()
            assert end.endswith(")"), expr
            scope = code[group_start(code, len(end) - 1) : len(end)]
        names = METRIC.findall(scope)
        assert names, f"no backburner metric under {match[0]!r} in {expr!r}"
        for name in names:
            missing = labels - exported()[name].labels - TARGET_LABELS
            assert not missing, f"{name} has no label {sorted(missing)} ({expr!r})"


def test_legends_name_labels_of_their_query() -> None:
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            grouped = {
                label.strip()
                for clause in GROUPING.findall(target["expr"])
                for label in clause.split(",")
            }
            for label in LEGEND_LABEL.findall(target.get("legendFormat", "")):
                assert label in grouped, f"{panel['title']!r}: legend {{{{{label}}}}} is lost"


@pytest.mark.parametrize("expr", EXPRS)
def test_counters_summed_and_gauges_maxed(expr: str) -> None:
    code = strip_strings(expr)
    for match in METRIC.finditer(code):
        sample = exported()[match[0]]
        call, start = enclosing_call(code, match.start())
        if sample.kind == "gauge":
            assert call in GAUGE_AGGREGATIONS, f"{match[0]} needs max() over instances: {expr!r}"
        else:
            assert call in RATES, f"{match[0]} needs rate() or increase(): {expr!r}"
            outer, _ = enclosing_call(code, start)
            assert outer == "sum", f"rate({match[0]}) needs sum() over instances: {expr!r}"


def test_alerts_have_every_kind_and_field() -> None:
    found = rules()
    names = [rule["alert"] for rule in found]
    assert len(names) == len(set(names))
    assert not ALERT_KINDS - set(names)
    for rule in found:
        assert rule["expr"].strip(), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]


def test_prometheus_scrapes_api_and_workers() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {"api:8000", "worker-1:9101", "worker-2:9101"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        # A machine tool, not a Python package: the structural checks above run everywhere;
        # these run where `apt-get install prometheus` put promtool (it is on this machine).
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return path


@pytest.mark.parametrize(
    "args",
    [
        ["check", "rules", str(ALERTS)],
        ["check", "config", str(CONFIG)],
        ["test", "rules", str(ALERT_TESTS)],
    ],
    ids=["check-rules", "check-config", "test-rules"],
)
def test_promtool(args: list[str]) -> None:
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_parses_dashboard_queries(tmp_path: Path) -> None:
    """The panels' PromQL parses: promtool checks it as recording rules."""
    grafana = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$type": ".*"}
    exprs = in_prefix("panel ")
    for variable, value in grafana.items():
        exprs = [expr.replace(variable, value) for expr in exprs]
    assert not [expr for expr in exprs if "$" in expr], "a Grafana variable is not replaced"
    group = {
        "name": "dashboard",
        "rules": [{"record": f"panel:{i}", "expr": e} for i, e in enumerate(exprs)],
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
