"""Submit a generation to a backburner server and print its tokens as they arrive.

python examples/client_stream.py http://127.0.0.1:8000   # or set BACKBURNER_URL

The stream resumes by itself (Last-Event-ID) if the connection drops on the way.
"""

from __future__ import annotations

import os
import sys

from backburner.client import Client


def main(url: str) -> int:
    with Client(url) as client:
        job = client.generate("Write a haiku about queues.", max_tokens=24)
        print("submitted", job.task_id)
        for event in client.stream(job.task_id):
            if event.type == "token":
                print(event.data["text"], end="", flush=True)
        task = client.get(job.task_id)
        print(f"\n{task.status.value}: {task.usage.output_tokens if task.usage else 0} tokens")
        return 0 if task.status == "completed" else 1


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BACKBURNER_URL")
    sys.exit(main(url or "http://127.0.0.1:8000"))
