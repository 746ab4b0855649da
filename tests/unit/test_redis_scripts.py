"""Each Redis script carries only the prelude statements it uses, and still loads and runs; a
job's document reads every field the hash may hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from backburner.backends import redis_codec
from backburner.backends.base import NewJob
from backburner.backends.redis_catalog import FLAGS, SCRIPTS, load_scripts
from backburner.backends.redis_scripts import CALL_STATE, Library, load_script, trim_prelude
from backburner.models import Job

from ..conftest import REDIS_TEST_URL, require_redis

PRELUDE = """-- a header comment
local P = ARGV[1]
local UNUSED = P .. 'x'
local A, B = 1, 2
-- about jkey
local function jkey(id) return P .. 'j:' .. id end

local function helper(id)
  return jkey(id) .. B
end
local function other() return UNUSED end
"""


def test_keeps_what_the_body_uses_directly_and_through_other_helpers_in_order() -> None:
    kept = trim_prelude(PRELUDE, "return helper(ARGV[2])")
    assert kept == (
        "local P = ARGV[1]\n"
        "local A, B = 1, 2\n"
        "local function jkey(id) return P .. 'j:' .. id end\n"
        "local function helper(id)\n  return jkey(id) .. B\nend\n"
    )


def test_a_body_that_uses_nothing_gets_nothing() -> None:
    assert trim_prelude(PRELUDE, "return redis.call('PING')") == ""


def test_a_statement_that_defines_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="defines nothing"):
        trim_prelude("local = 3\n", "return 1")


def test_the_hot_scripts_leave_most_of_the_prelude_out() -> None:
    full = load_script("finish").source.count("local function")
    assert load_script("heartbeat").source.count("local function") < full / 5
    assert load_script("claim").source.count("local function") < full


async def test_every_script_compiles_on_redis() -> None:
    # (A helper left out would only fail when run: the conformance suite runs every script.)
    require_redis()
    client = Redis.from_url(REDIS_TEST_URL)
    try:
        for name in (*SCRIPTS, "upgrade"):
            script = load_script(name)
            assert await client.script_load(script.source) == script.sha, name
    finally:
        await client.aclose()


def test_a_job_document_reads_every_job_field_the_spec_does_not_hold() -> None:
    # read_job and a claim read the hash by a fixed list (DOC_FIELDS in prelude.lua), so a
    # Job field added later must be either written into the spec or added to that list.
    prelude = (Path(redis_codec.__file__).parent / "redis_lua" / "prelude.lua").read_text()
    listed = re.search(r"local DOC_FIELDS = \{(.*?)\}", prelude, re.S)
    assert listed is not None
    names = re.findall(r"'([a-z_]+)'", listed.group(1))
    job = NewJob(
        task_id="t",
        type="x",
        input={},
        fingerprint="f",
        created_at=1.0,
        run_at=1.0,
        timeout_s=5.0,
        idempotency_key="k",
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    )
    spec = json.loads("{" + redis_codec.new_job_spec(job, "{}", "{}", "1.0", "60.0") + "}")
    made_elsewhere = {"progress", "history", "estimated_time_sec", "estimated_remaining_sec"}
    job_fields = [name for name in names if not name.startswith("_")]
    assert len(job_fields) == len(set(job_fields))
    assert set(job_fields) == set(Job.model_fields) - spec.keys() - made_elsewhere
    assert names[len(job_fields) :] == ["_pp", "_pm", "_hist", "_cur"]
    # (the first six are what a claim writes and does not read back: claim_jobs)
    assert names[:6] == [
        "status",
        "attempts",
        "fence",
        "worker_id",
        "lease_expires_at",
        "started_at",
    ]


def test_no_script_changes_a_prelude_local_but_the_call_state() -> None:
    # A library builds the prelude once per prefix and keeps it across calls: a helper or a
    # script that assigned one of its locals would leave the next call that value, where each
    # EVAL started afresh. CALL_STATE lists the ones a library resets on every call.
    lua = Path(redis_codec.__file__).parent / "redis_lua"
    prelude = (lua / "prelude.lua").read_text()
    top = set()
    for match in re.finditer(r"^local\s+(?:function\s+(\w+)|([\w\s,]+?)\s*=)", prelude, re.M):
        top |= {n.strip() for n in (match.group(1) or match.group(2)).split(",")}
    assigned = set()
    for path in lua.glob("*.lua"):
        for line in path.read_text().splitlines():
            code = line.split("--")[0]
            if re.match(r"\s*local\b", code):
                continue
            for name in top:
                if re.search(rf"(^|[^.\w]){name}(\s*,\s*\w+)*\s*=[^=]", code):
                    assigned.add(name)
    assert assigned, "the check found none of the known assignments (LATER): it is broken"
    assert assigned <= set(CALL_STATE) - {"ARGV"}


async def test_the_library_loads_on_redis_with_a_function_per_script() -> None:
    require_redis()
    library, scripts = load_scripts()
    client = Redis.from_url(REDIS_TEST_URL)
    try:
        try:
            assert await client.function_load(library.source) == library.name.encode()
        except ResponseError as exc:
            assert "already exists" in str(exc)
        (listed,) = await client.function_list(library=library.name)
    finally:
        await client.aclose()
    assert {s.function for s in scripts.values()} == {
        library.function_name(name) for name in library.scripts
    }
    assert set(library.scripts) == set(scripts)
    # (redis-py gives each as a flat list: name, value, ...)
    functions = [
        dict(zip(f[::2], f[1::2], strict=True))
        for f in dict(zip(listed[::2], listed[1::2], strict=True))[b"functions"]
    ]
    flags = {f[b"name"].decode(): {flag.decode() for flag in f[b"flags"]} for f in functions}
    assert flags == {
        library.function_name(name): {FLAGS[name]} if name in FLAGS else set()
        for name in library.scripts
    }
    assert {"read_jobs", "list_jobs", "read_events"} <= {
        name for name, flag in FLAGS.items() if flag == "no-writes"
    }


def test_a_flag_is_part_of_the_library_and_only_for_its_scripts() -> None:
    plain = Library(["read_jobs", "delete"], {})
    flagged = Library(["read_jobs", "delete"], {}, {"read_jobs": "no-writes"})
    assert flagged.name != plain.name  # a Redis holding one does not stand in for the other
    assert "flags={'no-writes'}" in flagged.source
    assert "flags=" not in plain.source
    with pytest.raises(ValueError, match="not in the library"):
        Library(["read_jobs"], {}, {"enqueue": "no-writes"})
