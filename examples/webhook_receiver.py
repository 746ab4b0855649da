"""A webhook receiver that verifies backburner's signatures and prints each event.

BACKBURNER_WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py 9000
(it listens on 127.0.0.1 over plain http: put it behind your TLS proxy, and submit jobs with
"webhook_url": "https://your-host/hooks")

It answers 204 to a message it accepts and 400 to one whose signature or timestamp is wrong.
A message id seen before is acknowledged again without being handled twice (retries and
redeliveries carry the same webhook-id).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from backburner.errors import WebhookVerificationError
from backburner.webhooks import verify

SECRET = os.environ.get("BACKBURNER_WEBHOOK_SECRET", "")
seen: set[str] = set()
seen_lock = threading.Lock()  # requests are served on threads, and a retry may overlap


class Hooks(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            verify(SECRET.split(), self.headers, body)
        except WebhookVerificationError as exc:
            print(f"refused: {exc}", flush=True)
            self.send_response(400)
            self.end_headers()
            return
        msg_id = self.headers["webhook-id"]
        with seen_lock:
            new = msg_id not in seen
            seen.add(msg_id)
        if new:
            event = json.loads(body)
            print(f"{event['type']} {event['task_id']}: {json.dumps(event)}", flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None  # one line per event is printed above


def main() -> None:
    if not SECRET:
        sys.exit("set BACKBURNER_WEBHOOK_SECRET to the secret the service signs with")
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    server = ThreadingHTTPServer(("127.0.0.1", port), Hooks)
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
