"""A process nobody scrapes or traces does not load prometheus_client or OpenTelemetry.

Each is imported by its first use: a worker without ``--metrics-port`` is ~2.5 MB smaller
without them. Run in a fresh interpreter, as this one has loaded both already.
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
        name: name in sys.modules for name in ("prometheus_client", "opentelemetry.trace")
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


def test_metrics_and_tracing_load_their_libraries_on_first_use() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["loaded_before"] == {"prometheus_client": False, "opentelemetry.trace": False}
    assert seen["tracing_before"] is False
    # A global provider set after the app was made is still found, and spans go to it.
    assert seen["tracing_after"] is True
    assert seen["exported"] is True
    assert seen["bucket_label"] is True  # the histograms' bounds, written as prometheus_client
