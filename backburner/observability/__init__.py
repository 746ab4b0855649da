"""Observability: Prometheus metrics (``metrics``)."""

from .metrics import Metrics

__all__ = ["Metrics"]
