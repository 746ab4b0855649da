"""Ask the ``research`` pipeline a question and follow it step by step.

    backburner serve examples.research.app:bb                      # terminal 1
    python -m examples.research.ask "What happens to a job when its worker crashes?"

Set BACKBURNER_URL for a server elsewhere (default http://127.0.0.1:8000).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from backburner.client import Client


def show(event_type: str, data: Any, seen: set[str]) -> None:
    if event_type == "step" and data["name"] == "plan":
        print("queries:", *(f"  - {q}" for q in data["result"]["queries"]), sep="\n")
    elif event_type == "step" and data["name"] == "sources":
        print("sources:", *(f"  [{s['n']}] {s['path']}" for s in data["result"]), sep="\n")
    elif event_type == "children":
        done = data["completed"] + data["failed"] + data["cancelled"]
        line = f"{data['name']}: {done}/{data['total']} children done"
        if line not in seen:  # the pipeline reports every few seconds while it waits
            seen.add(line)
            print(line)
    elif event_type == "step":
        print(f"step {data['name']} done")


def main(question: str, url: str) -> int:
    with Client(url) as client:
        job = client.submit("research", {"question": question})
        print("submitted", job.task_id)
        seen: set[str] = set()
        for event in client.stream(job.task_id):
            show(event.type, event.data, seen)
        task = client.get(job.task_id)
        if task.status != "completed" or task.result is None:
            print(task.status.value, task.error)
            return 1
        result = task.result
        print(f"\nanswer ({result['answer_by']}, model {result['model']}):\n{result['answer']}\n")
        for source in result["sources"]:
            print(f"[{source['n']}] {source['path']}: {source['note']}")
        return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    url = os.environ.get("BACKBURNER_URL", "http://127.0.0.1:8000")
    sys.exit(main(" ".join(sys.argv[1:]), url))
