"""Lock-free metric families export what prometheus_client's metrics would, sample for sample."""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from backburner.observability.series import (
    CounterFamily,
    Families,
    GaugeFamily,
    HistogramFamily,
)

BUCKETS = (0.01, 0.1, 1, 10)


def masked(exposition: bytes) -> str:
    """The exposition with the ``_created`` timestamps (the only values that differ) hidden."""
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", exposition.decode())


def ours() -> tuple[CollectorRegistry, dict[str, Any]]:
    registry, families = CollectorRegistry(), Families()
    metrics: dict[str, Any] = {
        "runs": families.add(CounterFamily("t_runs_total", "Runs.", ("type", "model"))),
        "plain": families.add(CounterFamily("t_plain_total", "No labels.")),
        "took": families.add(
            HistogramFamily("t_took_seconds", "Took.", ("type",), buckets=BUCKETS)
        ),
        "lone": families.add(HistogramFamily("t_lone_seconds", "Lone.", buckets=BUCKETS)),
        "depth": families.add(GaugeFamily("t_depth", "Depth.", ("priority",))),
        "workers": families.add(GaugeFamily("t_workers", "Workers.")),
    }
    families.register(registry)
    return registry, metrics


def theirs() -> tuple[CollectorRegistry, dict[str, Any]]:
    registry = CollectorRegistry()
    metrics: dict[str, Any] = {
        "runs": Counter("t_runs_total", "Runs.", ("type", "model"), registry=registry),
        "plain": Counter("t_plain_total", "No labels.", registry=registry),
        "took": Histogram("t_took_seconds", "Took.", ("type",), buckets=BUCKETS, registry=registry),
        "lone": Histogram("t_lone_seconds", "Lone.", buckets=BUCKETS, registry=registry),
        "depth": Gauge("t_depth", "Depth.", ("priority",), registry=registry),
        "workers": Gauge("t_workers", "Workers.", registry=registry),
    }
    return registry, metrics


def updates(m: dict[str, Any]) -> None:
    """The same calls, on either kind of metric."""
    runs, plain, took, lone, depth, workers = m.values()
    runs.labels("a", "").inc()
    runs.labels("a", "").inc(2.5)
    runs.labels("b", "gpt").inc()
    plain.inc()
    # on a bound (that bucket), between bounds, past every bound (+Inf), negative (the first)
    for amount in (0.01, 0.05, 1, 11, 1e6, -3, 0.0):
        took.labels("a").observe(amount)
    took.labels("b")
    lone.observe(0.5)
    depth.labels("1").set(4)
    depth.clear()
    depth.labels("2").set(7)
    workers.set(3)


def test_the_exposition_is_prometheus_clients_for_the_same_updates() -> None:
    mine, reference = ours(), theirs()
    assert masked(generate_latest(mine[0])) == masked(generate_latest(reference[0]))
    updates(mine[1])
    updates(reference[1])
    exposed = masked(generate_latest(mine[0]))
    assert exposed == masked(generate_latest(reference[0]))
    assert 't_took_seconds_bucket{le="0.01",type="a"} 3.0' in exposed  # -3, 0.0 and 0.01
    assert 't_took_seconds_bucket{le="+Inf",type="a"} 7.0' in exposed
    assert 't_runs_total{model="",type="a"} 3.5' in exposed


def test_a_restricted_scrape_finds_a_family_by_its_sample_name() -> None:
    registry, metrics = ours()
    updates(metrics)
    text = generate_latest(registry.restricted_registry(["t_runs_total"])).decode()
    assert 't_runs_total{model="gpt",type="b"} 1.0' in text
    assert "t_took_seconds" not in text and "t_depth" not in text


def test_created_samples_follow_prometheus_clients_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "True")
    registry, metrics = ours()
    updates(metrics)
    text = generate_latest(registry).decode()
    assert "_created" not in text
    assert 't_took_seconds_count{type="a"} 7.0' in text


def test_bad_updates_are_refused() -> None:
    _, metrics = ours()
    runs = metrics["runs"]
    assert isinstance(runs, CounterFamily)
    with pytest.raises(ValueError, match="only goes up"):
        runs.labels("a", "").inc(-1)
    with pytest.raises(ValueError, match="2 label values"):
        runs.labels("a")
    with pytest.raises(ValueError, match="increasing order"):
        HistogramFamily("t_bad", "Bad.", buckets=(1, 0.5))


def test_a_scrape_from_another_thread_sees_series_being_added() -> None:
    # The worker's metrics server collects from its own thread while jobs add series.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can
    registry, metrics = ours()
    runs, depth = metrics["runs"], metrics["depth"]
    scrapes = 0
    failures: list[BaseException] = []
    stop = threading.Event()

    def scrape() -> None:
        nonlocal scrapes
        try:
            while not stop.is_set():
                generate_latest(registry)
                scrapes += 1
        except BaseException as exc:
            failures.append(exc)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    added = 0
    try:
        while (scrapes < 50 or added < 20_000) and not failures and added < 5_000_000:
            if added % 2_000 == 0:
                runs.clear()  # (so the next ones are new series)
            runs.labels(f"type{added % 2_000}", "").inc()
            if added % 100 == 0:
                depth.clear()
                depth.labels(str(added)).set(added)
            added += 1
    finally:
        stop.set()
        scraper.join(30)
        sys.setswitchinterval(interval)
    assert failures == []
    assert scrapes >= 50
    text = generate_latest(registry).decode()
    assert f't_runs_total{{model="",type="type{(added - 1) % 2_000}"}} 1.0' in text
