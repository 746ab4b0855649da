"""Submit a generation to a backburner server, then poll it (with backoff) until it is done.

python examples/client_poll.py http://127.0.0.1:8000     # or set BACKBURNER_URL
"""

from __future__ import annotations

import os
import sys

from backburner.client import Client


def main(url: str) -> int:
    with Client(url) as client:
        job = client.generate("Explain job leases in one line.", max_tokens=24)
        print("submitted", job.task_id)
        # poll() waits between looks as the server's Retry-After asks (else 1, 2, 4 ... 30 s)
        for task in client.poll(job.task_id, timeout=300):
            print(f"  {task.status.value:<10} {task.progress.percent:5.1f}%")
        if task.status != "completed":
            print(f"{task.status.value}: {task.error}", file=sys.stderr)
            return 1
        print("result:", task.result["text"])
        return 0


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BACKBURNER_URL")
    sys.exit(main(url or "http://127.0.0.1:8000"))
