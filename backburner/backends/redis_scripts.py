"""The Lua scripts of the Redis backend, each with just the part of the prelude it uses.

Every script starts with ``redis_lua/prelude.lua``'s helpers. Redis runs a script's whole
text on every call, so each helper it defines costs every call a closure (measured: the full
prelude made an otherwise empty script 4 to 5 times as costly). The loader keeps only the
top-level statements of the prelude that the script uses, directly or through other helpers,
in their order.
"""

from __future__ import annotations

import re
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

_BATCH_MAIN = """
-- The batch form: ARGV is P, n, then n groups of (their length, the script's ARGV after P).
local out, at = {}, 3
for k = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[at])
  local args = {ARGV[1]}
  for x = 1, n do args[x + 1] = ARGV[at + x] end
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
    if "types_from" in _names(kept + body):
        raise ValueError(f"script {name!r} reads the global ARGV: it has no batch form")
    source = kept + "local function one(ARGV)\n" + body + "\nend\n" + main_text
    return Script(name + BATCH_SUFFIX, source)
