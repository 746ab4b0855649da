"""A process loads a library only when it uses it: a worker nobody scrapes or traces, whose
webhooks go to ASCII host names and which reads no TOML file, loads none of prometheus_client
(and its HTTP server's modules), OpenTelemetry, idna's tables or tomllib: ~2.5 MB of a worker's
memory. Run in a fresh interpreter, as this one has loaded them all already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import json, sys

    from backburner import Backburner

    bb = Backburner("memory://")

    @bb.task()
    async def noop(ctx) -> None:
        pass

    bb.worker(concurrency=10)
    before = {
        name: name in sys.modules
        for name in ("prometheus_client", "opentelemetry.trace", "idna", "tomllib")
    }
    tracing_before = bb.tracing.enabled

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    exposition = bb.metrics.render().decode()
    print(json.dumps({
        "loaded_before": before,
        "tracing_before": tracing_before,
        "tracing_after": bb.tracing.enabled,
        "exported": "backburner_tasks_submitted_total" in exposition,
        "bucket_label": 'le="1.0"' in exposition,
    }))
    """
)


def test_a_worker_loads_metrics_tracing_idna_and_toml_on_first_use() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["loaded_before"] == {
        "prometheus_client": False,
        "opentelemetry.trace": False,
        "idna": False,
        "tomllib": False,
    }
    assert seen["tracing_before"] is False
    # A global provider set after the app was made is still found, and spans go to it.
    assert seen["tracing_after"] is True
    assert seen["exported"] is True
    assert seen["bucket_label"] is True  # the histograms' bounds, written as prometheus_client
