"""A producer process for chaos tests: enqueue ``chaos`` jobs at a steady rate until told to stop.

    python -m tests.chaos.producer URL ACK_FILE MARKER_DIR RATE STOP_FILE SEED

Each job has its own idempotency key; an enqueue that fails (backend down) is retried with the
same key, with backoff, until it is acknowledged. One JSON line per outcome goes to ACK_FILE:
``{"ack": task_id, "key", "sent", "t", "created"}`` once enqueue returned (the job is then
acknowledged: it must never be lost) or ``{"err": type, "msg", "key", "t"}`` per failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

from backburner import Backburner, Settings
from tests import chaosapp


async def main(url: str, ack_path: str, marker_dir: str, rate: float, stop: str, seed: int) -> None:
    bb = Backburner(url, settings=Settings(backend_url=url))
    bb.tasks.update(chaosapp.bb.tasks)
    rng = random.Random(seed)
    pace = time.monotonic()
    with open(ack_path, "a", buffering=1) as out:
        i = 0
        while not os.path.exists(stop):
            key = f"chaos-{seed}-{i}"
            payload = {"seconds": round(rng.uniform(0.0, 0.5), 3), "marker_dir": marker_dir}
            delay = 0.05
            while True:
                sent = time.time()
                try:
                    job, created = await asyncio.wait_for(
                        bb.submit("chaos", payload, idempotency_key=key), 10
                    )
                except Exception as exc:  # any failure: record its type, back off, retry
                    line = {"err": type(exc).__name__, "msg": str(exc)[:300], "key": key}
                    out.write(json.dumps({**line, "t": time.time()}) + "\n")
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                ack = {"ack": job.task_id, "key": key, "sent": sent, "created": created}
                out.write(json.dumps({**ack, "t": time.time()}) + "\n")
                break
            i += 1
            pace = max(pace + 1 / rate, time.monotonic() - 1)
            await asyncio.sleep(max(0.0, pace - time.monotonic()))
    await bb.close()


if __name__ == "__main__":
    url, ack, markers, rate, stop, seed = sys.argv[1:7]
    asyncio.run(main(url, ack, markers, float(rate), stop, int(seed)))
