"""The Lua scripts of the Redis backend, each with just the part of the prelude it uses.

Every script starts with ``redis_lua/prelude.lua``'s helpers. Redis runs a script's whole
text on every call, so each helper it defines costs every call a closure (measured: the full
prelude made an otherwise empty script 4 to 5 times as costly). The loader keeps only the
top-level statements of the prelude that the script uses, directly or through other helpers,
in their order. Where Redis has Functions (7.0 on), the same scripts run as the functions of
one library instead (``Library``), whose helpers are built once per key prefix.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from importlib import resources

from .redis_link import Script

_STATEMENT = re.compile(r"^local\s", re.MULTILINE)
_DEFINES = re.compile(r"^local\s+(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w\s,]*?)\s*=)")
_NAME = re.compile(r"[A-Za-z_]\w*")


def _statements(prelude: str) -> list[tuple[frozenset[str], str]]:
    """The prelude's top-level statements (each starts a line with ``local``), each with the
    names it defines. The comment lines between statements are left out."""
    starts = [m.start() for m in _STATEMENT.finditer(prelude)]
    statements = []
    for start, end in zip(starts, [*starts[1:], len(prelude)], strict=True):
        lines = prelude[start:end].splitlines(keepends=True)
        while lines[-1].strip() == "" or lines[-1].startswith("--"):
            lines.pop()
        text = "".join(lines)
        match = _DEFINES.match(text)
        if match is None:
            raise ValueError(f"prelude statement defines nothing: {text[:60]!r}")
        names = match.group(1) or match.group(2)
        statements.append((frozenset(n.strip() for n in names.split(",")), text))
    return statements


def _names(text: str) -> set[str]:
    return set(_NAME.findall(text))  # comments too: a name that only looks used costs little


def trim_prelude(prelude: str, body: str) -> str:
    """The statements of ``prelude`` that ``body`` needs, directly or through each other.

    A statement only uses what the ones before it define, so one pass from the end finds
    them all. A name that merely looks used (in a comment) keeps a statement it did not need:
    harmless. What precedes the first statement is comments: left out."""
    needed = _names(body)
    kept: list[str] = []
    for names, text in reversed(_statements(prelude)):
        if names & needed:
            kept.append(text)
            needed |= _names(text)
    return "".join(reversed(kept))


def _lua(name: str) -> str:
    """The text of ``redis_lua/<name>.lua``."""
    return resources.files(__package__).joinpath("redis_lua", f"{name}.lua").read_text()


def load_script(name: str) -> Script:
    """The script ``redis_lua/<name>.lua`` with the prelude it needs."""
    body = _lua(name)
    return Script(name, trim_prelude(_lua("prelude"), body) + body)


BATCH_SUFFIX = "_many"


def _check_batchable(name: str, text: str) -> None:
    """A script's batch form runs its body once per group, as a function of the group's ARGV:
    ``text`` (the body and the prelude it uses) must not read the global ARGV."""
    if "types_from" in _names(text):
        raise ValueError(f"script {name!r} reads the global ARGV: it has no batch form")


_BATCH_MAIN = """
-- The batch form: ARGV is P, n, then n groups of (their length, the script's ARGV after P).
local out, at = {}, 3
for k = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[at])
  local args = {ARGV[1], unpack(ARGV, at + 1, at + n)}
  -- A Lua error (not a refusal) fails its own group only: the groups before it stay applied.
  local ok, reply = pcall(one, args)
  if not ok then
    reply = type(reply) == 'table' and reply.err and reply or redis.error_reply(tostring(reply))
  end
  out[k] = reply or false
  at = at + n + 1
end
return out
"""


def load_batched_script(name: str, main: str | None = None) -> Script:
    """``redis_lua/<name>.lua`` run once per group of arguments, in one call (``<name>_many``):
    the script's body becomes a function of its own ARGV; the replies come back as a list, a
    refusal (error reply, or a Lua error of its group) in its place. Each group is applied in
    turn, as if alone: a group that fails leaves the ones before it applied.

    Only for scripts whose prelude helpers do not read the global ARGV (``types_from`` does).
    ``main``: the name of a script of its own that calls ``one`` for the groups instead."""
    body = _lua(name)
    main_text = _BATCH_MAIN if main is None else _lua(main)
    kept = trim_prelude(_lua("prelude"), body + main_text)
    _check_batchable(name, kept + body)
    source = kept + "local function one(ARGV)\n" + body + "\nend\n" + main_text
    return Script(name + BATCH_SUFFIX, source)


CALL_STATE = ("ARGV", "LATER")
"""The prelude's locals that a call changes: each call of a library function starts them
afresh (ARGV: the call's arguments, read by ``types_from``; LATER: finish_many's gathered
writes, nil outside it), as each EVAL of a script did."""

MAX_PREFIXES = 16
"""Key prefixes a library keeps its helpers built for; one more starts the cache over."""

_NAME_SLOT = "@LIBRARY@"
"""Where the library's name goes in its source, once the source's digest has made it."""

_LIBRARY_CALL = f"""
local built, count = {{}}, 0
local function call(name, args)
  local entry = built[args[1]]
  if not entry then
    if count >= {MAX_PREFIXES} then built, count = {{}}, 0 end
    entry = {{build(args[1])}}
    built[args[1]] = entry
    count = count + 1
  end
  entry[1](args)
  return entry[2][name](args)
end
"""


class Library:
    """A Redis Functions library of scripts (Redis >= 7: FUNCTION LOAD, then FCALL).

    Redis compiles a library once, when it is loaded, and keeps what its top level defines:
    the prelude's helpers are made once per key prefix (the first call with it) rather than on
    every call, as a script's are. A script's body becomes a function of its ARGV, called by
    ``FCALL <function_name(script)>`` with the same KEYS and ARGV as ``EVALSHA``. The library's
    name holds a digest of its source: releases that differ load libraries that differ, side by
    side, and a library of that name is the same code whoever loaded it."""

    def __init__(
        self,
        names: Sequence[str],
        batched: Mapping[str, str | None],
        flags: Mapping[str, str] | None = None,
    ) -> None:
        """``batched``: the scripts that also get a batch form (``load_batched_script``),
        each with its main script or None. ``flags``: a Redis function flag for a script
        (``no-writes``, ``allow-oom``); one without has none, so Redis refuses to start it
        when memory is past ``maxmemory`` (before it writes anything)."""
        prelude = _lua("prelude")
        defined = {name for names_, _ in _statements(prelude) for name in names_}
        missing = [name for name in CALL_STATE if name != "ARGV" and name not in defined]
        if missing:
            raise ValueError(f"prelude lacks the call state {missing}")
        parts = ["local function build(prefix)\nlocal ARGV = {prefix}\n", prelude, "local S = {}\n"]
        self.scripts = [*names]
        for name in names:
            parts.append(f"S[{name!r}] = function(ARGV)\n{_lua(name)}\nend\n")
        for name, main in batched.items():
            _check_batchable(name, trim_prelude(prelude, _lua(name)) + _lua(name))
            main_text = _BATCH_MAIN if main is None else _lua(main)
            parts.append(
                f"do\nlocal one = S[{name!r}]\n"
                f"S[{name + BATCH_SUFFIX!r}] = function(ARGV)\n{main_text}\nend\nend\n"
            )
            self.scripts.append(name + BATCH_SUFFIX)
        resets = "; ".join(f"{n} = {'args' if n == 'ARGV' else 'nil'}" for n in CALL_STATE)
        parts.append(f"local function enter(args) {resets} end\nreturn enter, S\nend\n")
        body = "".join(parts)
        flags = flags or {}
        unknown = set(flags) - set(self.scripts)
        if unknown:
            raise ValueError(f"flags for scripts not in the library: {sorted(unknown)}")
        registered = "".join(
            f"redis.register_function{{function_name='{_NAME_SLOT}_{n}', "
            f"callback=function(keys, args) return call({n!r}, args) end"
            + (f", flags={{'{flags[n]}'}}" if n in flags else "")
            + "}\n"
            for n in self.scripts
        )
        source = body + _LIBRARY_CALL + registered
        # The digest of all of it, the library's name left out (the function names repeat it).
        self.name = "bb_" + hashlib.sha1(source.encode()).hexdigest()[:12]
        self.source = f"#!lua name={self.name}\n" + source.replace(_NAME_SLOT, self.name)

    def function_name(self, script: str) -> str:
        return f"{self.name}_{script}"
