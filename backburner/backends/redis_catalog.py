"""The Redis backend's scripts: which there are, how each is called, and loading them.

Each runs as a function of one Redis Functions library where Redis has Functions, else by
EVALSHA (``redis_scripts``)."""

from __future__ import annotations

from ..errors import BackendConnectionError, BackendError
from .redis_link import Script
from .redis_reads import READ_SCRIPTS
from .redis_scripts import BATCH_SUFFIX, Library, load_batched_script, load_script
from .redis_webhooks import WEBHOOK_READS, WEBHOOK_SAFE_TO_REPEAT, WEBHOOK_SCRIPTS

SCRIPTS = (
    "enqueue",
    "claim",
    "heartbeat",
    "append_event",
    "finish",
    "cancel",
    "poll_cancellations",
    "replay",
    "delete",
    "purge_expired",
    "next_due",
    "idle",
    "unidle",
    "slot_acquire",
    "slot_renew",
    "wake",
    "watch_heads",
    *READ_SCRIPTS,
    *WEBHOOK_SCRIPTS,
)


SAFE_TO_REPEAT = frozenset(
    {
        *READ_SCRIPTS,
        "watch_heads",  # (it makes a stream, once)
        "next_due",
        "idle",
        "unidle",
        "heartbeat",
        "slot_acquire",
        "slot_renew",
        *WEBHOOK_SAFE_TO_REPEAT,
    }
)
"""Scripts that change nothing (or, like a heartbeat or a slot's acquire, the same thing
twice)."""


ALLOW_OOM = ("delete", "purge_expired", "poll_cancellations", "heartbeat", "watch_heads")
"""Scripts that only delete, or write what is bounded by what is there: a heartbeat rewrites
leases in place and adds a record only for a new worker (purge_expired forgets the old ones);
watch_heads gives a job one empty stream, once."""

FLAGS = {
    **{name: "no-writes" for name in (*READ_SCRIPTS, *WEBHOOK_READS, "next_due")},
    **{name: "allow-oom" for name in ALLOW_OOM},
}
"""The Redis function flags of the scripts that write nothing (``no-writes``) or what
ALLOW_OOM says (``allow-oom``). Unlike the others, they run on a Redis that is out of memory
(past ``maxmemory`` with ``noeviction``): jobs are still read and waited for, finished ones
deleted, and running ones keep their leases. By EVALSHA, Redis looks at memory only at a
script's first write instead, and refuses it if that write may add data."""

BATCHED = {"enqueue": (None, 200, True), "finish": ("finish_many", 32, False)}
"""The scripts a process calls many times in one loop turn: each has a batch form (made by
load_batched_script with this main script), of at most so many calls, and whether its batcher
is eager. Finishes go in smaller batches: a worker runs the jobs of one batch's next claims
while Redis works on the next. A producer's enqueues are eager (Redis works on the first of a
turn while the producer makes the rest; gathering made 64 in flight slower in 5 of 6
alternating runs); a worker's finishes gather (a batch shares one claim, and Redis bounds a
drain: about a fifth faster in two alternating series, half as many calls)."""


def load_scripts() -> tuple[Library, dict[str, Script]]:
    """The scripts, as Lua scripts and as the functions of one library (either runs)."""
    batched = {name: main for name, (main, _, _) in BATCHED.items()}
    library = Library(SCRIPTS, batched, FLAGS)
    scripts = {name: load_script(name) for name in SCRIPTS}
    for name, (main, _, _) in BATCHED.items():
        scripts[name + BATCH_SUFFIX] = load_batched_script(name, main)
    for name, script in scripts.items():
        script.function, script.library = library.function_name(name), library.source
    return library, scripts


def hand_off_commands(scripts: dict[str, Script]) -> frozenset[str]:
    """How an enqueue is called (its function names and SHA1s, alone and in a batch): the
    script that may hand its job to an idle worker at once (redis_pipe.HAND_OFF_LEAD)."""
    names: set[str] = set()
    for script in (scripts["enqueue"], scripts["enqueue" + BATCH_SUFFIX]):
        names.add(script.sha)
        if script.function is not None:
            names.add(script.function)
    return frozenset(names)


def lacks_functions(error: BackendError) -> bool:
    """Whether FUNCTION LOAD failed for want of Redis Functions (Redis < 7, or an ACL or a
    managed Redis that does not allow them): the scripts then go as EVALSHA."""
    if isinstance(error, BackendConnectionError):  # (no answer of Redis: a Sentinel's, say)
        return False
    message = str(error)
    return any(s in message for s in ("unknown command", "NOPERM", "unknown subcommand"))
