"""Submitting, reading, listing, cancelling, deleting and replaying jobs over HTTP.

Each test runs through httpx.ASGITransport and against a real uvicorn server (``transport``),
except where the transport cannot matter.
"""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path
from typing import Any

import httpx

from ..helpers import eventually
from .conftest import JOB_FIELDS, TERMINAL, assert_error, serve

ACCEPTED_FIELDS = {"task_id", "status", "estimated_time_sec", "poll_url", "stream_url"}


def retry_after(response: httpx.Response) -> int:
    value = response.headers.get("retry-after")
    assert value is not None and value.isdigit(), response.headers
    seconds = int(value)
    assert 1 <= seconds <= 30, seconds
    return seconds


def check_accepted(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == ACCEPTED_FIELDS, body
    task_id = body["task_id"]
    assert re.fullmatch(r"task_[0-9a-f]{32}", task_id), task_id  # >= 122 random bits
    assert body["status"] == "queued"
    assert body["poll_url"] == f"/v1/tasks/{task_id}"
    assert body["stream_url"] == f"/v1/tasks/{task_id}/events"
    assert response.headers["location"] == body["poll_url"]
    retry_after(response)
    return body


async def test_post_tasks_answers_202_with_where_to_poll_and_stream(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path) as srv:
        first = check_accepted(
            await srv.client.post("/v1/tasks", json={"type": "quick", "input": {"seconds": 0.01}})
        )
        second = check_accepted(await srv.client.post("/v1/tasks", json={"type": "quick"}))
        assert first["task_id"] != second["task_id"]
        assert first["estimated_time_sec"] is None  # nothing of this type has finished yet
        # The Location answers with the job.
        polled = await srv.client.get(first["poll_url"])
        assert polled.status_code == 200
        assert polled.json()["task_id"] == first["task_id"]
        assert polled.json()["type"] == "quick"


async def test_post_generate_answers_202_and_the_job_completes(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path) as srv:
        accepted = check_accepted(
            await srv.client.post(
                "/v1/generate",
                json={"prompt": "Say hi", "max_tokens": 5, "metadata": {"user": "u1"}},
            )
        )
        job = await srv.wait_for(accepted["task_id"], "completed")
        assert job["type"] == "generate"
        assert job["result"]["simulated"] is True
        assert len(job["result"]["text"].split()) == 5
        assert job["usage"]["output_tokens"] == 5
        assert job["metadata"] == {"user": "u1"}
        chat = check_accepted(
            await srv.client.post(
                "/v1/generate",
                json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
            )
        )
        assert (await srv.wait_for(chat["task_id"], "completed"))["usage"]["output_tokens"] == 3


async def test_job_view_has_the_design_fields_and_retry_after_until_terminal(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path) as srv:
        task_id = await srv.submit(
            "hold",
            {"seconds": 60},
            priority=7,
            metadata={"k": [1, 2]},
            webhook_url="https://example.invalid/hook",
            max_attempts=1,
            ttl_s=600,
        )
        await srv.wait_started(task_id)
        running = await srv.client.get(f"/v1/tasks/{task_id}")
        assert running.status_code == 200
        view = running.json()
        assert set(view) >= JOB_FIELDS, JOB_FIELDS - set(view)
        assert view["status"] == "processing"
        assert view["priority"] == 7
        assert view["metadata"] == {"k": [1, 2]}
        assert view["webhook_url"] == "https://example.invalid/hook"
        assert view["input"] == {"seconds": 60}
        assert view["attempts"] == 1 and view["max_attempts"] == 1
        assert view["started_at"] >= view["created_at"]
        assert view["finished_at"] is None and view["result"] is None and view["error"] is None
        assert set(view["progress"]) == {"percent", "message"}
        retry_after(running)  # not terminal: tells the client when to poll again

        cancelled = await srv.client.post(f"/v1/tasks/{task_id}/cancel")
        assert cancelled.status_code == 200
        done = await srv.client.get(f"/v1/tasks/{task_id}")
        assert done.status_code == 200
        assert "retry-after" not in done.headers  # terminal: nothing to wait for
        view = done.json()
        assert view["status"] == "cancelled"
        assert view["finished_at"] >= view["started_at"]
        assert view["estimated_remaining_sec"] == 0.0
        assert view["expires_at"] is not None
        # A job with a webhook stays at least until its webhook's last retry could be due.
        kept = max(600, srv.settings.webhook_retention_s())
        assert math.isclose(view["expires_at"], view["finished_at"] + kept, abs_tol=1.0)


async def test_completed_job_has_result_usage_progress_and_no_retry_after(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path) as srv:
        response = await srv.client.post("/v1/generate", json={"prompt": "p", "max_tokens": 16})
        task_id = check_accepted(response)["task_id"]
        job = await srv.wait_for(task_id, "completed")
        final = await srv.client.get(f"/v1/tasks/{task_id}")
        assert "retry-after" not in final.headers
        assert job["attempts"] == 1
        assert job["error"] is None
        assert job["usage"]["input_tokens"] == 1 and job["usage"]["output_tokens"] == 16
        assert job["progress"]["percent"] == 100.0
        assert job["created_at"] <= job["started_at"] <= job["finished_at"] < job["expires_at"]
        assert job["estimated_remaining_sec"] == 0.0


async def test_estimates_follow_the_recent_durations_of_each_task_type(tmp_path: Path) -> None:
    # One transport only: the estimator does not depend on it, and the estimate of a type can
    # stay cached as unknown for a few seconds after the first submission of that type.
    async with serve("live", tmp_path) as srv:
        quick = [await srv.submit("quick", {"seconds": 0.05}) for _ in range(3)]
        slow = [await srv.submit("slow", {"seconds": 0.6}) for _ in range(3)]
        jobs = {task_id: await srv.wait_for(task_id, "completed") for task_id in quick + slow}

        def mean_run_time(ids: list[str]) -> float:
            return sum(jobs[i]["finished_at"] - jobs[i]["started_at"] for i in ids) / len(ids)

        # The estimate may be cached (as unknown) for a few seconds: poll until it appears.
        estimates: dict[str, float] = {}

        async def known() -> bool:
            for name, ids in (("quick", quick), ("slow", slow)):
                value = (await srv.job(ids[0]))["estimated_time_sec"]
                if value is None:
                    return False
                estimates[name] = value
            return True

        await eventually(known, timeout=30, interval=0.2, message="estimates")
        assert math.isclose(estimates["quick"], mean_run_time(quick), abs_tol=0.002)
        assert math.isclose(estimates["slow"], mean_run_time(slow), abs_tol=0.002)
        assert 0.05 <= estimates["quick"] < 0.5
        assert 0.6 <= estimates["slow"] < 5.0
        # A new job of each type is told its type's estimate, not a constant.
        answer = await srv.client.post("/v1/tasks", json={"type": "slow", "delay_s": 3600})
        body = check_accepted(answer)
        assert body["estimated_time_sec"] == estimates["slow"]
        assert retry_after(answer) == math.ceil(estimates["slow"])
        queued = await srv.job(body["task_id"])
        assert queued["estimated_time_sec"] == estimates["slow"]
        # Not due for an hour: what remains is the wait for it, then a typical run.
        assert 3590 < queued["estimated_remaining_sec"] - estimates["slow"] <= 3600
        polled = await srv.client.get(body["poll_url"])
        assert retry_after(polled) == 30
        quick_answer = await srv.client.post("/v1/tasks", json={"type": "quick"})
        assert check_accepted(quick_answer)["estimated_time_sec"] == estimates["quick"]
        # While a job runs, what remains is the estimate minus the time it has run.
        running = await srv.submit("slow", {"seconds": 30})
        view = await srv.wait_for(running, "processing")
        assert view["estimated_time_sec"] == estimates["slow"]
        assert 0.0 <= view["estimated_remaining_sec"] <= estimates["slow"]


async def test_list_is_newest_first_filters_and_pages_each_job_once(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        types = ["quick", "slow", "quick", "quick", "slow", "quick", "slow"]
        ids = [await srv.submit(t) for t in types]
        cancelled = [ids[1], ids[3]]
        for task_id in cancelled:
            assert (await srv.client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 200
        newest_first = ids[::-1]

        listing = await srv.client.get("/v1/tasks")
        assert listing.status_code == 200
        body = listing.json()
        assert set(body) == {"data", "next_cursor"}
        assert [j["task_id"] for j in body["data"]] == newest_first
        assert body["next_cursor"] is None
        assert all(set(j) >= JOB_FIELDS for j in body["data"])

        assert await srv.task_ids(status="cancelled") == cancelled[::-1]
        assert await srv.task_ids(status="queued") == [
            i for i in newest_first if i not in cancelled
        ]
        assert await srv.task_ids(type="slow") == [ids[6], ids[4], ids[1]]
        assert await srv.task_ids(type="quick", status="cancelled") == [ids[3]]
        assert await srv.task_ids(type="nope") == []
        assert await srv.task_ids(status="completed") == []

        # Pages of 2: every job exactly once, in order, even with a job added meanwhile.
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 2}
            if cursor is not None:
                params["cursor"] = cursor
            page = (await srv.client.get("/v1/tasks", params=params)).json()
            pages += 1
            assert len(page["data"]) <= 2
            seen += [j["task_id"] for j in page["data"]]
            cursor = page["next_cursor"]
            if pages == 1:
                late = await srv.submit("quick")
            if cursor is None:
                break
            assert pages < 10
        assert seen == newest_first
        assert pages == 4
        assert late not in seen
        # Filters and cursors together.
        first = (await srv.client.get("/v1/tasks", params={"limit": 1, "type": "slow"})).json()
        rest = await srv.task_ids(type="slow", cursor=first["next_cursor"])
        assert [j["task_id"] for j in first["data"]] + rest == [ids[6], ids[4], ids[1]]

        for params in ({"status": "bogus"}, {"limit": 0}, {"limit": 1001}, {"cursor": "xyz"}):
            assert_error(await srv.client.get("/v1/tasks", params=params), 422)


async def test_cancel_stops_a_running_job_and_is_idempotent(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path) as srv:
        task_id = await srv.submit("hold", {"seconds": 60})
        await srv.wait_started(task_id)
        response = await srv.client.post(f"/v1/tasks/{task_id}/cancel")
        assert response.status_code == 200
        job = response.json()
        assert set(job) >= JOB_FIELDS
        assert job["task_id"] == task_id and job["status"] == "cancelled"
        assert job["finished_at"] is not None
        # The handler is interrupted, not left running.
        await eventually(
            lambda: srv.probe.has(srv.probe.interrupted, task_id),
            timeout=20,
            message="the handler was cancelled",
        )
        again = await srv.client.post(f"/v1/tasks/{task_id}/cancel")
        assert again.status_code == 200
        assert again.json()["status"] == "cancelled"
        assert again.json()["finished_at"] == job["finished_at"]
        assert (await srv.job(task_id))["status"] == "cancelled"
        assert not srv.probe.has(srv.probe.finished, task_id)
        # The worker is free again: a new job runs to the end.
        follow_up = await srv.submit("quick")
        assert (await srv.wait_for(follow_up))["status"] == "completed"
        assert (await srv.job(task_id))["status"] == "cancelled"


async def test_cancel_a_queued_job_means_it_never_runs(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path) as srv:
        task_id = await srv.submit("hold", {"seconds": 0.01}, delay_s=3600)
        response = await srv.client.post(f"/v1/tasks/{task_id}/cancel")
        assert response.status_code == 200
        job = response.json()
        assert job["status"] == "cancelled"
        assert job["attempts"] == 0 and job["started_at"] is None
        assert not srv.probe.has(srv.probe.started, task_id)


async def test_delete_a_finished_job_then_it_is_gone(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path) as srv:
        task_id = await srv.submit("quick")
        done = await srv.wait_for(task_id, "completed")
        # Cancelling a finished job changes nothing (and is not an error).
        cancel = await srv.client.post(f"/v1/tasks/{task_id}/cancel")
        assert cancel.status_code == 200
        assert cancel.json()["status"] == "completed"
        assert cancel.json()["finished_at"] == done["finished_at"]
        response = await srv.client.delete(f"/v1/tasks/{task_id}")
        assert response.status_code == 204
        assert response.content == b""
        assert_error(await srv.client.get(f"/v1/tasks/{task_id}"), 404, "not_found")
        assert_error(await srv.client.get(f"/v1/tasks/{task_id}/events"), 404, "not_found")
        assert_error(await srv.client.delete(f"/v1/tasks/{task_id}"), 404, "not_found")
        assert task_id not in await srv.task_ids()


async def test_delete_a_running_or_queued_job_is_a_conflict(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path) as srv:
        running = await srv.submit("hold", {"seconds": 60})
        queued = await srv.submit("hold", {"seconds": 60}, delay_s=3600)
        await srv.wait_started(running)
        assert_error(await srv.client.delete(f"/v1/tasks/{running}"), 409, "invalid_state")
        assert_error(await srv.client.delete(f"/v1/tasks/{queued}"), 409, "invalid_state")
        assert (await srv.job(running))["status"] == "processing"
        assert (await srv.job(queued))["status"] == "queued"
        assert not srv.probe.has(srv.probe.interrupted, running)
        for task_id in (running, queued):
            assert (await srv.client.post(f"/v1/tasks/{task_id}/cancel")).status_code == 200
            assert (await srv.client.delete(f"/v1/tasks/{task_id}")).status_code == 204


async def test_dead_letter_queue_lists_failed_jobs_and_replays_them(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path) as srv:
        doomed = await srv.submit("doomed")
        second = await srv.submit("second_chance")
        fine = await srv.submit("quick")
        for task_id in (doomed, second):
            job = await srv.wait_for(task_id, "failed")
            assert job["error"]["type"] and job["error"]["message"]
            assert job["error"]["retryable"] is False
            assert job["attempts"] == 1
        await srv.wait_for(fine, "completed")

        dlq = await srv.client.get("/v1/dlq")
        assert dlq.status_code == 200
        body = dlq.json()
        assert [j["task_id"] for j in body["data"]] == [second, doomed]  # newest first
        assert body["next_cursor"] is None
        entry = body["data"][1]
        assert entry["status"] == "failed"
        (attempt,) = entry["history"]
        assert attempt["attempt"] == 1 and attempt["error"]["message"] == "this task always fails"
        paged = (await srv.client.get("/v1/dlq", params={"limit": 1})).json()
        assert [j["task_id"] for j in paged["data"]] == [second]
        rest = (await srv.client.get("/v1/dlq", params={"cursor": paged["next_cursor"]})).json()
        assert [j["task_id"] for j in rest["data"]] == [doomed]

        replayed = await srv.client.post(f"/v1/dlq/{second}/replay")
        assert replayed.status_code == 200
        view = replayed.json()
        assert view["task_id"] == second
        assert view["status"] in {"queued", "processing", "completed"}
        assert view["max_attempts"] > view["attempts"] or view["status"] == "completed"
        done = await srv.wait_for(second, TERMINAL)
        assert done["status"] == "completed" and done["result"] == {"attempt": 2}
        assert [a["attempt"] for a in done["history"]] == [1, 2]  # the history is kept
        assert [j["task_id"] for j in (await srv.client.get("/v1/dlq")).json()["data"]] == [doomed]

        # Only failed jobs can be replayed.
        assert_error(await srv.client.post(f"/v1/dlq/{second}/replay"), 409, "invalid_state")
        assert_error(await srv.client.post(f"/v1/dlq/{fine}/replay"), 409, "invalid_state")


async def test_stats_count_jobs_by_status_priority_and_workers(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path) as srv:
        running = await srv.submit("hold", {"seconds": 60})
        await srv.submit("quick", priority=7, delay_s=3600)
        await srv.submit("quick", priority=7, delay_s=3600)
        await srv.submit("quick", priority=-3, delay_s=3600)
        failed = await srv.submit("doomed")
        await srv.wait_for(failed, "failed")
        await srv.wait_started(running)
        stats: dict[str, Any] = {}

        async def settled() -> bool:
            response = await srv.client.get("/v1/stats")
            assert response.status_code == 200
            stats.update(response.json())
            # A worker reports what it runs with its next heartbeat.
            workers = stats["workers"]
            return stats["processing"] == 1 and len(workers) == 1 and workers[0]["running"] == 1

        await eventually(settled, timeout=20, interval=0.1, message="stats with a worker")
        assert set(stats) == {
            "counts",
            "queued_by_priority",
            "due",
            "webhooks",
            "processing",
            "dead_letter",
            "workers",
        }
        counts = {k: v for k, v in stats["counts"].items() if v}
        assert counts == {"queued": 3, "processing": 1, "failed": 1}
        assert stats["queued_by_priority"] == {"7": 2, "-3": 1}
        assert stats["due"] == 0  # all three wait an hour
        assert stats["dead_letter"] == 1
        (worker,) = stats["workers"]
        assert set(worker) == {"worker_id", "last_seen", "running", "started_at"}
        assert worker["running"] == 1
        assert worker["last_seen"] >= worker["started_at"]


async def test_health_and_readiness(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        health = await srv.client.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        ready = await srv.client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}


async def test_unknown_routes_and_methods_use_the_error_shape(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        assert_error(await srv.client.get("/v1/nothing-here"), 404, "not_found")
        assert_error(await srv.client.put("/v1/tasks", json={}), 405, "method_not_allowed")


async def test_405_lists_every_method_of_the_path(transport: str, tmp_path: Path) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        for method, path, allowed in [
            ("OPTIONS", "/v1/tasks", {"GET", "POST"}),
            ("PATCH", f"/v1/tasks/task_{'0' * 32}", {"GET", "DELETE"}),
            # (the batch routes are a router included in the API's: FastAPI nests it lazily)
            ("GET", "/v1/batches", {"POST"}),
            ("DELETE", f"/v1/batches/task_{'0' * 32}", {"GET"}),
            ("GET", f"/v1/batches/task_{'0' * 32}/cancel", {"POST"}),
        ]:
            response = await srv.client.request(method, path)
            assert_error(response, 405, "method_not_allowed")
            listed = {m.strip() for m in response.headers["allow"].split(",")}
            assert listed == allowed, (method, path, response.headers["allow"])


async def test_an_unreadable_job_is_a_typed_500_and_left_out_of_listings(
    transport: str, tmp_path: Path
) -> None:
    async with serve(transport, tmp_path, run_worker=False) as srv:
        bad = check_accepted(await srv.client.post("/v1/tasks", json={"type": "quick"}))
        good = check_accepted(await srv.client.post("/v1/tasks", json={"type": "quick"}))
        with sqlite3.connect(tmp_path / "api.db") as conn:  # damaged behind the API's back
            conn.execute(
                "UPDATE jobs SET metadata = ? WHERE task_id = ?",
                ('{"a":"\\ud800"}', bad["task_id"]),
            )
        body = assert_error(await srv.client.get(bad["poll_url"]), 500, "corrupt_record")
        assert body["message"].startswith(
            f"job {bad['task_id']}: its stored record cannot be read ("
        )
        assert await srv.task_ids() == [good["task_id"]]
        assert (await srv.client.get(good["poll_url"])).status_code == 200


async def test_a_damaged_event_is_a_typed_500_or_a_stream_that_ends_cleanly(
    transport: str, tmp_path: Path
) -> None:
    # It was a 500 internal_error with a JSONDecodeError traceback, or a 200 whose body was
    # cut off mid-stream (the client retried six times, then gave up with TransportError).
    async with serve(transport, tmp_path, run_worker=False) as srv:
        job = check_accepted(await srv.client.post("/v1/tasks", json={"type": "quick"}))
        assert (await srv.client.post(f"/v1/tasks/{job['task_id']}/cancel")).status_code == 200
        with sqlite3.connect(tmp_path / "api.db") as conn:  # damaged behind the API's back
            conn.execute(
                "UPDATE events SET data = '{bad' WHERE task_id = ? AND seq = 2", (job["task_id"],)
            )
        events = f"/v1/tasks/{job['task_id']}/events"
        resumed = await srv.client.get(events, headers={"Last-Event-ID": "1"})
        body = assert_error(resumed, 500, "corrupt_record")
        assert body["message"].startswith(f"job {job['task_id']}: its stored record cannot be read")
        whole = await srv.client.get(events)  # (read to its end: not cut off)
        assert whole.status_code == 200 and whole.text.startswith("retry: 1000\n\n")
        assert "id: 2\n" not in whole.text
