"""Each Redis script carries only the prelude statements it uses, and still loads and runs."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from backburner.backends.redis import _SCRIPTS
from backburner.backends.redis_scripts import load_script, trim_prelude

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
        for name in (*_SCRIPTS, "upgrade"):
            script = load_script(name)
            assert await client.script_load(script.source) == script.sha, name
    finally:
        await client.aclose()
