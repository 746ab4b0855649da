"""A redis-server of the benchmark's own, on a port of its own (never the machine's 6379)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis


@contextmanager
def own_redis(argv: list[str], port: int, *, start_s: float = 60) -> Iterator[redis.Redis]:
    """Run ``argv`` (a redis-server command line, maybe under valgrind) and yield a client of
    it once it answers on ``port``; shut it down without saving afterwards."""
    if port == 6379:
        raise SystemExit("use a port of its own: 6379 is the machine's Redis")
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{argv[0]} did not start on port {port}") from None
                time.sleep(0.2)
        yield client
    finally:
        try:
            client.shutdown(nosave=True)
        except redis.RedisError:
            process.terminate()
        process.wait(timeout=60)
        client.close()


def server_argv(server: str, port: int, *options: str) -> list[str]:
    """A redis-server on 127.0.0.1:port that keeps nothing on disk, with more ``options``."""
    return [
        server,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        *options,
    ]
