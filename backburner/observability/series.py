"""Counters, gauges and histograms updated without locks, exported by prometheus_client.

prometheus_client takes a lock for every ``inc()`` and ``observe()`` and looks for a
histogram's bucket in a Python loop: a worker updates four series for every job it runs, and
that cost a no-op job a tenth of its worker's time. Here a series is plain attributes, updated
from the event loop's thread; a scrape (from any thread: the worker's metrics server runs in
one) reads them as it collects. Each family exports what the prometheus_client metric of its
name and kind would, sample for sample.

prometheus_client is imported by the first collect, not before: a process nobody scrapes (a
worker without ``--metrics-port``) never loads it and its HTTP server's modules (~2.5 MB).
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector, CollectorRegistry

_S = TypeVar("_S")
_F = TypeVar("_F", bound="_Family[Any]")


def _created_wanted() -> bool:
    """prometheus_client's own switch for the ``_created`` samples (on unless disabled)."""
    setting = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False")
    return setting.lower() not in ("true", "1", "t")


class _Family(Generic[_S]):
    """One metric: its series by label values (made on first use, like ``labels()``)."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name.removesuffix("_total") if self.kind == "counter" else name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], _S] = {}
        if not self.labelnames:
            self._series[()] = self._new()

    def labels(self, *values: str) -> _S:
        """The series of these label values, in the order of ``labelnames``."""
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"{self.name} takes {len(self.labelnames)} label values (str)")
            series = self._series[values] = self._new()
        return series

    def clear(self) -> None:
        """Forget every labelled series (a new dict: a scrape reading the old one is unhurt)."""
        self._series = {} if self.labelnames else {(): self._new()}

    def _new(self) -> _S:
        raise NotImplementedError

    def _snapshot(self) -> tuple[tuple[dict[str, str], _S], ...]:
        # A dict's copy() runs no Python code (not even the garbage collector's, which may
        # switch threads): no other thread changes it meanwhile.
        series = self._series.copy()
        return tuple((dict(zip(self.labelnames, k, strict=True)), s) for k, s in series.items())

    def collect(self, created: bool) -> Metric:
        raise NotImplementedError


class CounterSeries:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class CounterFamily(_Family[CounterSeries]):
    kind = "counter"

    def _new(self) -> CounterSeries:
        return CounterSeries()

    def inc(self, amount: float = 1.0) -> None:
        """Add to the one series of a counter without labels."""
        self.labels().inc(amount)

    def collect(self, created: bool) -> Metric:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample

        metric = Metric(self.name, self.documentation, self.kind)
        for labels, series in self._snapshot():
            metric.samples.append(Sample(self.name + "_total", labels, series.value))
            if created:
                metric.samples.append(Sample(self.name + "_created", labels, series.created))
        return metric


class GaugeSeries:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)


class GaugeFamily(_Family[GaugeSeries]):
    kind = "gauge"

    def _new(self) -> GaugeSeries:
        return GaugeSeries()

    def set(self, value: float) -> None:
        """Set the one series of a gauge without labels."""
        self.labels().set(value)

    def collect(self, created: bool) -> Metric:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample

        metric = Metric(self.name, self.documentation, self.kind)
        for labels, series in self._snapshot():
            metric.samples.append(Sample(self.name, labels, series.value))
        return metric


class HistogramSeries:
    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        """Observations per bucket (not cumulative); the last is past every bound (+Inf)."""
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # (a bucket holds what is <= its bound: the first bound not below the amount)
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class HistogramFamily(_Family[HistogramSeries]):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
    ) -> None:
        bounds = tuple(float(b) for b in buckets if float(b) != float("inf"))
        if not bounds or list(bounds) != sorted(bounds):
            raise ValueError("a histogram needs buckets, in increasing order")
        self.bounds = bounds
        self._le: tuple[str, ...] = ()
        """Each bucket's ``le`` label as prometheus_client writes it (1 as "1.0"), from the first
        collect."""
        super().__init__(name, documentation, labelnames)

    def _new(self) -> HistogramSeries:
        return HistogramSeries(self.bounds)

    def observe(self, amount: float) -> None:
        """Observe on the one series of a histogram without labels."""
        self.labels().observe(amount)

    def collect(self, created: bool) -> Metric:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample
        from prometheus_client.utils import floatToGoString

        if not self._le:
            go_float: Callable[[float], str] = floatToGoString  # (untyped in its package)
            self._le = (*(go_float(b) for b in self.bounds), "+Inf")
        metric = Metric(self.name, self.documentation, self.kind)
        add = metric.samples.append
        for labels, series in self._snapshot():
            total, counts, value_sum = 0.0, list(series.counts), series.sum
            for le, count in zip(self._le, counts, strict=True):
                total += count
                add(Sample(self.name + "_bucket", {**labels, "le": le}, total))
            add(Sample(self.name + "_count", labels, total))
            if self.bounds[0] >= 0:  # (as prometheus_client: no sum with negative buckets)
                add(Sample(self.name + "_sum", labels, value_sum))
            if created:
                add(Sample(self.name + "_created", labels, series.created))
        return metric


class Families:
    """Families collected in the order they were added; ``register`` them once all are (a
    prometheus_client Collector, duck-typed: its base class would import prometheus_client)."""

    def __init__(self) -> None:
        self.families: list[_Family[Any]] = []
        self._created = _created_wanted()

    def add(self, family: _F) -> _F:
        self.families.append(family)
        return family

    def register(self, registry: CollectorRegistry) -> None:
        """Add them to ``registry`` (which reads their names now: add every family first)."""
        registry.register(cast("Collector", self))

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.collect(self._created)

    def describe(self) -> list[Metric]:
        # (the registry checks names for duplicates with this, without collecting)
        from prometheus_client.metrics_core import Metric

        return [Metric(f.name, f.documentation, f.kind) for f in self.families]
