"""Server-sent events against a real uvicorn server: order, replay, resume, disconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backburner.api.events import EventHub
from backburner.backends.memory import MemoryBackend

from ..conformance._support import claim_one, new_job
from ..helpers import eventually
from .conftest import TERMINAL, Server, assert_error, serve


@dataclass(frozen=True)
class Sse:
    """One dispatched SSE item: an event (id, event, data) or a comment (comment set)."""

    id: int | None = None
    event: str | None = None
    data: Any = None
    comment: str | None = None

    @property
    def terminal(self) -> bool:
        return self.event == "status" and self.data["data"]["status"] in TERMINAL


async def parse_sse(response: httpx.Response) -> AsyncIterator[Sse]:
    """The items of an SSE body as they arrive (a minimal parser of the spec)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields:
                yield Sse(
                    id=int(fields["id"]) if "id" in fields else None,
                    event=fields.get("event", "message"),
                    data=json.loads(fields["data"]),
                )
            fields = {}
        elif line.startswith(":"):
            yield Sse(comment=line[1:].strip())
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


async def read_all(
    srv: Server, task_id: str, *, seen_to_the_end: bool = False, **request: Any
) -> list[Sse]:
    """Every event of one stream, until the server closes it (within a deadline).
    ``seen_to_the_end``: a finished job resumed past its last event, which is a 204."""
    items: list[Sse] = []
    async with asyncio.timeout(60):
        async with srv.client.stream("GET", f"/v1/tasks/{task_id}/events", **request) as response:
            if seen_to_the_end:
                assert response.status_code == 204, await response.aread()
                assert await response.aread() == b""
                return []
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-cache"
            items = [item async for item in parse_sse(response) if item.comment is None]
    return items


def check_log(events: list[Sse], task_id: str, *, first: int = 1) -> None:
    """ids are the job's seqs, consecutive from ``first``, and the log ends at its terminal."""
    assert [e.id for e in events] == list(range(first, first + len(events)))
    for event in events:
        assert event.data["seq"] == event.id
        assert event.data["task_id"] == task_id
        assert event.data["type"] == event.event
    assert events and events[-1].terminal, events[-1:]
    assert not any(e.terminal for e in events[:-1])


async def wait_for_subscriptions(srv: Server, count: int, timeout: float = 10.0) -> None:
    await eventually(
        lambda: srv.subscriptions == count,
        timeout=timeout,
        interval=0.02,
        message=f"{count} open streams on the server (now {srv.subscriptions})",
    )


async def generate(srv: Server, max_tokens: int) -> str:
    response = await srv.client.post("/v1/generate", json={"prompt": "p", "max_tokens": max_tokens})
    assert response.status_code == 202
    return str(response.json()["task_id"])


async def test_a_live_stream_sends_every_event_in_order_then_closes_and_replays(
    tmp_path: Path,
) -> None:
    async with serve("live", tmp_path) as srv:
        task_id = await generate(srv, 20)
        live = await read_all(srv, task_id)
        check_log(live, task_id)
        statuses = [e.data["data"]["status"] for e in live if e.event == "status"]
        assert statuses == ["queued", "processing", "completed"]
        tokens = [e.data["data"] for e in live if e.event == "token"]
        assert sum(t["tokens"] for t in tokens) == 20  # a token event may carry several
        job = await srv.job(task_id)
        assert job["status"] == "completed"
        assert "".join(t["text"] for t in tokens) == job["result"]["text"]
        assert [e.event for e in live].count("progress") == 20 // 8
        await wait_for_subscriptions(srv, 0)

        # A stream opened on the finished job replays the same log and closes.
        replay = await read_all(srv, task_id)
        assert replay == live
        await wait_for_subscriptions(srv, 0)


async def test_resume_with_last_event_id_or_after_gives_exactly_the_rest(tmp_path: Path) -> None:
    async with serve("live", tmp_path) as srv:
        task_id = await generate(srv, 10)
        await srv.wait_for(task_id, "completed")
        log = await read_all(srv, task_id)
        check_log(log, task_id)
        last = log[-1].id
        assert last is not None
        for position in sorted({0, 1, 2, 5, last - 1, last}):
            # Seen to its end: 204, which tells an EventSource to stop reconnecting.
            end = position == last
            by_header = await read_all(
                srv, task_id, seen_to_the_end=end, headers={"Last-Event-ID": str(position)}
            )
            assert by_header == log[position:], position
            by_query = await read_all(srv, task_id, seen_to_the_end=end, params={"after": position})
            assert by_query == log[position:], position
        # A browser's EventSource keeps ?after= in the URL and adds the header on reconnect:
        # the header (the later position) wins.
        both = await read_all(srv, task_id, params={"after": 1}, headers={"Last-Event-ID": "4"})
        assert both == log[4:]
        beyond = await read_all(
            srv, task_id, seen_to_the_end=True, headers={"Last-Event-ID": str(last + 100)}
        )
        assert beyond == []
        twice = await srv.client.get(
            f"/v1/tasks/{task_id}/events", headers=[("Last-Event-ID", "1"), ("Last-Event-ID", "2")]
        )
        assert_error(twice, 422, "invalid_input")
        await wait_for_subscriptions(srv, 0)


async def test_a_forced_disconnect_mid_stream_then_resume_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    async with serve("live", tmp_path) as srv:
        task_id = await generate(srv, 80)  # about 1.6 s of tokens
        first: list[Sse] = []
        async with (
            asyncio.timeout(30),
            httpx.AsyncClient(base_url=str(srv.client.base_url)) as own,
            own.stream("GET", f"/v1/tasks/{task_id}/events") as response,
        ):
            assert response.status_code == 200
            async for item in parse_sse(response):
                if item.comment is None:
                    first.append(item)
                if len([e for e in first if e.event == "token"]) >= 3:
                    break  # leaving both blocks drops the connection mid-body
        assert not first[-1].terminal, "the job ended before the disconnect"
        assert [e.id for e in first] == list(range(1, len(first) + 1))
        assert (await srv.job(task_id))["status"] == "processing"
        await wait_for_subscriptions(srv, 0)  # the server noticed and freed the stream

        second = await read_all(srv, task_id, headers={"Last-Event-ID": str(first[-1].id)})
        union = first + second
        check_log(union, task_id)  # 1..last, each exactly once, ending with the terminal one
        assert union[-1].data["data"]["status"] == "completed"
        assert sum(e.data["data"]["tokens"] for e in union if e.event == "token") == 80
        await wait_for_subscriptions(srv, 0)


async def test_the_server_frees_streams_as_soon_as_clients_disconnect(tmp_path: Path) -> None:
    # The default keep-alive (15 s) is longer than the deadline: no write is needed to notice.
    async with serve("live", tmp_path) as srv:
        task_id = await srv.submit("hold", {"seconds": 60})
        await srv.wait_started(task_id)
        clients = [httpx.AsyncClient(base_url=str(srv.client.base_url)) for _ in range(3)]
        responses: list[httpx.Response] = []
        try:
            for client in clients:
                request = client.build_request("GET", f"/v1/tasks/{task_id}/events")
                response = await client.send(request, stream=True)
                assert response.status_code == 200
                responses.append(response)
            await wait_for_subscriptions(srv, 3)
            for opened, (response, client) in enumerate(zip(responses, clients, strict=True)):
                await response.aclose()
                await client.aclose()
                await wait_for_subscriptions(srv, 2 - opened, timeout=5.0)
        finally:
            for response, client in zip(responses, clients, strict=False):
                await response.aclose()
                await client.aclose()
        assert (await srv.job(task_id))["status"] == "processing"  # only the streams went away
        assert (await srv.client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 200


async def test_a_stream_resumed_past_the_log_still_ends_with_its_job(tmp_path: Path) -> None:
    # Only a seq past its Last-Event-ID woke it, and none came: it ran on to the keep-alive.
    async with serve("live", tmp_path, sse_keepalive_s=60) as srv:
        task_id = await srv.submit("hold", {"seconds": 60})
        await srv.wait_started(task_id)
        headers = {"Last-Event-ID": "999"}
        async with (
            asyncio.timeout(30),  # (not the 60 s keep-alive)
            srv.client.stream("GET", f"/v1/tasks/{task_id}/events", headers=headers) as response,
        ):
            assert response.status_code == 200
            await wait_for_subscriptions(srv, 1)
            cancel = await srv.client.post(f"/v1/tasks/{task_id}/cancel")
            assert cancel.status_code == 200
            items = [item async for item in parse_sse(response)]
        assert [item for item in items if item.comment is None] == []  # all at or before 999
        await wait_for_subscriptions(srv, 0)


async def test_an_idle_stream_sends_keep_alive_comments_until_the_end(tmp_path: Path) -> None:
    async with serve("live", tmp_path, sse_keepalive_s=0.2) as srv:
        task_id = await srv.submit("hold", {"seconds": 60})
        await srv.wait_started(task_id)
        events: list[Sse] = []
        keepalives_before_cancel = 0
        async with (
            asyncio.timeout(30),
            srv.client.stream("GET", f"/v1/tasks/{task_id}/events") as response,
        ):
            assert response.status_code == 200
            async for item in parse_sse(response):
                if item.comment is not None:
                    assert item.comment == "keep-alive"
                    if any(e.event == "tick" for e in events):
                        keepalives_before_cancel += 1
                        if keepalives_before_cancel == 3:
                            cancel = await srv.client.post(f"/v1/tasks/{task_id}/cancel")
                            assert cancel.status_code == 200
                else:
                    events.append(item)
            # The server ended the stream after the terminal event.
        assert keepalives_before_cancel >= 3
        check_log(events, task_id)
        assert [e.event for e in events] == ["status", "status", "tick", "status"]
        assert events[-1].data["data"]["status"] == "cancelled"
        await wait_for_subscriptions(srv, 0)


async def test_a_log_longer_than_one_read_batch_streams_whole(tmp_path: Path) -> None:
    """The stream reads the log in batches (500): more than two batches, each event once."""
    async with serve("live", tmp_path) as srv:
        task_id = await srv.submit("burst", {"events": 1100})
        live = await read_all(srv, task_id)
        check_log(live, task_id)
        assert [e.data["data"]["i"] for e in live if e.event == "item"] == list(range(1100))
        assert (await srv.job(task_id))["result"] == 1100
        resumed = await read_all(srv, task_id, headers={"Last-Event-ID": "499"})
        assert resumed == live[499:]
        await wait_for_subscriptions(srv, 0)


async def test_the_hub_asks_once_about_a_job_gone_while_its_stream_is_stuck() -> None:
    # A stream blocked on a slow client cannot end; the job it follows was deleted. The hub
    # wakes it once and stops asking: asking again answers at once ("gone"), over and over.
    backend = MemoryBackend()
    await backend.connect()
    asked: list[dict[str, int]] = []
    wait = backend.wait_for_events

    async def counted(after: Mapping[str, int], *, timeout: float) -> dict[str, int]:
        asked.append(dict(after))
        return await wait(after, timeout=timeout)

    backend.wait_for_events = counted  # type: ignore[method-assign]
    hub = EventHub(backend, idle_timeout_s=30.0)
    try:
        stuck = hub.subscribe("task_" + "0" * 32, after=500)  # never reads again
        await asyncio.wait_for(stuck.wake.wait(), 10)
        for _ in range(500):  # a spinning hub would ask on every turn of the loop
            await asyncio.sleep(0)
        assert asked == [{"task_" + "0" * 32: 500}]
        other, _ = await backend.enqueue(new_job("t", now=1.0))
        fresh = hub.subscribe(other.task_id, after=1)  # the hub still follows the others
        claimed = await claim_one(backend, other.task_id, now=2.0)
        await asyncio.wait_for(fresh.wake.wait(), 10)
        assert claimed.fence == 1
        assert [sorted(a) for a in asked[1:]] == [[other.task_id]] * (len(asked) - 1)
        hub.unsubscribe(stuck)
        hub.unsubscribe(fresh)
    finally:
        await hub.close()
        await backend.close()
