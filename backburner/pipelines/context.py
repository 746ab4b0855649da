"""What a pipeline's code sees: ``ctx.step``, ``ctx.map`` and ``ctx.spawn`` (docs/pipelines.md).

A pipeline runs again from the top after a crash, a lost lease, a retry, or whenever it waited
for children. Each completed step's result is in the job's event log (a ``step`` event), so on
every later run the step returns that result without running again. Children are ordinary
jobs with ``parent_id``; while some are unfinished the pipeline parks (``Suspend``): its worker
slot is free, and the last child to end wakes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import (
    ChildFailedError,
    InvalidInputError,
    InvalidResultError,
    InvalidTransitionError,
    JobNotFoundError,
    PermanentError,
    PipelineDefinitionError,
    QueueFullError,
    Retry,
    Suspend,
    WaitForChildren,
)
from ..jsoncodec import round_trip
from ..models import Job, JobStatus

if TYPE_CHECKING:
    from ..app import Backburner
    from ..context import JobContext

STEP_EVENT = "step"
"""``{"name", "result", "within", "at"}``: a step's stored result (a map's: its children's
results); ``within``: the step it was called in (null: the pipeline itself), ``at``: its
place among the steps called there (events of an earlier release have neither)."""
SPAWN_EVENT = "spawned"
"""``{"name", "children", "within", "at"}``: the ids of the children a map or spawn
enqueued."""
RERUN_EVENT = "rerun"
"""``{"name", "children"}``: children of a map or spawn that had failed or been cancelled
when the pipeline was replayed, run again by the run after the replay."""
CHILDREN_EVENT = "children"
"""``{"name", "total", "completed", "failed", "cancelled"}``: children seen at a run."""
PIPELINE_EVENTS = frozenset({STEP_EVENT, SPAWN_EVENT})
_SPAWN_CHUNK = 100
QUIET_POLL_CAP_S = 60.0
"""The longest a parked pipeline waits between looks at children in which nothing changed."""


_OWN_OPTIONS = frozenset({"idempotency_key", "parent_id", "tenant", "limits"})
"""Options of enqueue that a pipeline sets for each child itself."""


PARTIAL_KEY_END = " partial"
"""How the idempotency key of a child of a ``partial=True`` map ends (any other child's ends
in its index): its failure is one of the map's results, and need not wake its parent."""


def _child_key(parent_id: str, name: str, index: int, *, partial: bool = False) -> str:
    """The idempotency key of a child: the same in every run, so a run that enqueues again
    finds the children an earlier one did. A space: no Idempotency-Key an API client sends
    can take it. A name too long for a key (at most 255 characters) goes in as a digest."""
    end = PARTIAL_KEY_END if partial else ""
    key = f"{parent_id} {name} {index}{end}"
    if len(key) <= 255:
        return key
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{parent_id} #{digest} {index}{end}"


class StepRetry:
    """How a step retries its own failures before failing the pipeline's attempt."""

    def __init__(self, attempts: int = 1, *, backoff_s: float = 0.5, cap_s: float = 10.0) -> None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidInputError(f"step attempts must be an integer >= 1, got {attempts!r}")
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.cap_s = cap_s


@dataclass
class Recorded:
    """What earlier runs of a pipeline stored (``pipelines._recorded``)."""

    steps: list[tuple[str, tuple[str, Any, Any]]] = field(default_factory=list)
    """Its ``step`` and ``spawned`` events, in order: (kind, (name, value, place))."""
    rerun: dict[str, set[str]] | None = None
    """None if it was never replayed; else the children each map ran again since its last
    replay."""


class PipelineContext:
    """``ctx`` of a pipeline: a JobContext (progress, emit, llm, ...) plus durable steps."""

    def __init__(
        self,
        ctx: JobContext,
        app: Backburner,
        recorded: list[tuple[str, tuple[str, Any, Any]]],
        *,
        rerun: dict[str, set[str]] | None = None,
    ) -> None:
        self._ctx = ctx
        self._app = app
        self._rerun = rerun
        """None if the pipeline was never replayed; else the children each map ran again
        since its last replay (Recorded.rerun)."""
        self._results: dict[str, Any] = {}
        self._spawned: dict[str, list[str]] = {}
        for kind, (name, value, _) in recorded:
            if kind == STEP_EVENT:
                self._results[name] = value
            else:
                self._spawned[name] = value
        self._earlier: dict[str | None, dict[int, str]] = {}
        """Where each step of earlier runs began: the step it was called in (None: the
        pipeline itself) -> its place among the steps called there -> its name. A step's
        own record comes when it ends, after those of the steps within it; a step that
        never ended left its place empty. Events of a release before ``within`` and ``at``
        were written are all placed in the pipeline, in the order they were written."""
        self._legacy = not all(isinstance(p, tuple) for _, (_, _, p) in recorded)
        if not self._legacy:
            for _, (name, _, (within, at)) in recorded:
                self._earlier.setdefault(within, {}).setdefault(at, name)
        else:
            names = self._earlier.setdefault(None, {})
            for _, (name, _, _) in recorded:
                if name not in names.values():
                    names[len(names)] = name
        self._seen: set[str] = set()
        self._running: list[str] = []
        """The steps running now, innermost last: a step begun meanwhile is within the last."""
        self._placed: dict[str, tuple[str | None, int]] = {}
        """Where each step of this run began: (the step it was called in, its place there)."""
        self._begun: Counter[str | None] = Counter()
        self.parked: str | None = None
        """Why this run parked (a map's children still run); nothing may follow it."""

    # -- what JobContext offers -----------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    @property
    def job(self) -> Job:
        return self._ctx.job

    @property
    def job_id(self) -> str:
        return self._ctx.job_id

    # -- steps -------------------------------------------------------------------------------

    def _begin(self, name: str) -> None:
        if self.parked is not None:
            raise PipelineDefinitionError(
                f"step {name!r} was called after this run parked ({self.parked}): an except"
                " clause caught the wait of ctx.map or ctx.spawn (Suspend); let it propagate"
            )
        if not isinstance(name, str) or not name:
            raise PipelineDefinitionError("a step name must be a non-empty string")
        if name in self._seen:
            raise PipelineDefinitionError(
                f"step name {name!r} is used twice in one run; step names must be unique"
            )
        self._seen.add(name)
        # (events of an earlier release place every step in the pipeline, in one count)
        within = self._running[-1] if self._running and not self._legacy else None
        at = self._begun[within]
        self._begun[within] += 1
        self._placed[name] = (within, at)
        if name in self._results or name in self._spawned:
            return
        before = self._earlier.get(within, {}).get(at)
        if before is not None and before != name:
            where = "of the pipeline" if within is None else f"within step {within!r}"
            raise PipelineDefinitionError(
                f"step {at + 1} {where} is {name!r} in this run but was {before!r} before: a"
                " pipeline must call its steps in the same order every run, one after"
                " another (make step names and the code that chooses them deterministic; run"
                " work in parallel with ctx.map)"
            )

    def _place_of(self, name: str) -> dict[str, Any]:
        within, at = self._placed[name]
        return {"within": within, "at": at}

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: StepRetry | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` (async or not) once per job: its result is stored, and
        every later run of the pipeline gets the stored result without running it."""
        self._begin(name)
        if name in self._results:
            return self._results[name]
        self._running.append(name)
        try:
            value = await self._run_step(name, fn, args, kwargs, retry or StepRetry())
        finally:
            self._running.pop()
        try:
            result = round_trip(value, f"the result of step {name!r}")
        except InvalidInputError as exc:
            raise InvalidResultError(str(exc)) from None
        await self._record(name, result)
        return result

    async def _run_step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        policy: StepRetry,
    ) -> Any:
        """``fn``'s value, retried in place as ``policy`` says."""
        began: set[str] = set(self._seen)
        for attempt in range(1, policy.attempts + 1):
            if attempt > 1:
                self._forget_since(name, began)
            try:
                if inspect.iscoroutinefunction(fn):
                    value = await fn(*args, **kwargs)
                else:
                    # A plain function runs in a thread: on the event loop, one that blocked
                    # (a sync SDK's call) held every job of the worker, their cancels and
                    # heartbeats with them (a review's cancel waited 5.5 s).
                    value = await asyncio.to_thread(fn, *args, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                return value
            except (PermanentError, Suspend):
                raise
            except Exception as exc:
                if attempt == policy.attempts:
                    raise
                delay = min(policy.cap_s, policy.backoff_s * 2 ** (attempt - 1))
                asked = exc.after if isinstance(exc, Retry) else None  # (a 429's Retry-After)
                if asked is not None and asked > policy.cap_s:
                    raise  # a long wait is the job's: parked, not holding a worker slot
                await asyncio.sleep(max(delay, asked or 0.0))
        raise AssertionError("a step ran out of attempts without raising")  # pragma: no cover

    def _forget_since(self, name: str, began: set[str]) -> None:
        """Step ``name`` runs again in place (StepRetry): the steps called in its last try
        may be called again (they were "used twice"); those that ended give their stored
        results, as in a run after a crash."""
        for inner in self._seen - began:
            self._seen.discard(inner)
            self._placed.pop(inner, None)
            self._begun.pop(inner, None)
        self._begun.pop(name, None)

    async def _record(self, name: str, result: Any) -> None:
        """Store a step's (or a map's) result as its ``step`` event. One that cannot be stored
        fails the job at once: its record nests two levels deeper than the result itself."""
        try:
            await self._ctx.record(
                STEP_EVENT, {"name": name, "result": result, **self._place_of(name)}
            )
        except InvalidInputError as exc:
            raise InvalidResultError(
                f"the result of step {name!r} cannot be stored: {exc}"
            ) from None
        self._results[name] = result

    # -- children ----------------------------------------------------------------------------

    async def spawn(
        self,
        name: str,
        task: str | Callable[..., Awaitable[Any]],
        input: dict[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Run one child job of ``task`` with ``input`` and return its result (waiting for it
        without holding a worker). Options as for enqueue (priority, max_attempts, timeout,
        ...)."""
        (result,) = await self._children(name, task, [input or {}], None, options, partial=False)
        return result

    async def map(
        self,
        name: str,
        task: str | Callable[..., Awaitable[Any]],
        items: Sequence[Any],
        *,
        partial: bool = False,
        metadata: Sequence[dict[str, Any]] | None = None,
        **options: Any,
    ) -> list[Any]:
        """One child job of ``task`` per item, run in parallel by any workers; their results,
        in item order. An item is the task's one parameter, or a dict of its parameters.
        ``metadata``: one dict per item, stored on its child. Other options as for enqueue
        (priority, max_attempts, timeout, ...).

        A child that fails for good fails the pipeline with ChildFailedError naming it; with
        ``partial=True`` its result is None instead."""
        definition = self._app.tasks.get(_task_name(task))
        try:
            inputs = [_child_input(definition, item) for item in items]
        except InvalidInputError as exc:
            raise PipelineDefinitionError(f"{name!r}: {exc}") from None
        if metadata is not None and len(metadata) != len(inputs):
            raise PipelineDefinitionError(f"{name!r}: map needs one metadata dict per item")
        extra = None if metadata is None else list(metadata)
        return await self._children(name, task, inputs, extra, options, partial=partial)

    async def _children(
        self,
        name: str,
        task: str | Callable[..., Awaitable[Any]],
        inputs: list[dict[str, Any]],
        metadata: list[dict[str, Any]] | None,
        options: dict[str, Any],
        *,
        partial: bool,
    ) -> list[Any]:
        self._begin(name)
        if name in self._results:
            return list(self._results[name])
        ids = self._spawned.get(name)
        if ids is None:
            self._check_children(name, _task_name(task), inputs, metadata, options)
            try:
                ids = await self._enqueue(
                    name, _task_name(task), inputs, metadata, options, partial=partial
                )
            except QueueFullError:
                # With children of its own queued or running, wait for the room they make as
                # they end, not fail: a batch of 1,000 under max_queue_size 50 failed in 4 s,
                # its running requests cancelled. The next run enqueues again: the children
                # made so far are found by their keys. With none, nothing of its own makes
                # room (parked pipelines count as queued: waiting ones would fill the queue
                # for ever): the error stands, and the job's retries apply.
                if not await self._app.backend.has_open_children(self.job_id):
                    raise
                self.parked = f"waiting for room in the queue to enqueue {name!r}"
                raise WaitForChildren(
                    self.parked, after=self._app.settings.pipeline_poll_s
                ) from None
        children = await self._read(ids, name, partial=partial)
        if self._rerun is not None and await self._rerun_ended(name, children):
            children = await self._read(ids, name, partial=partial)
        counts = {s.value: 0 for s in JobStatus}
        for child in children:
            if child is not None:
                counts[child.status.value] += 1
        open_ = counts["queued"] + counts["processing"]
        done = len(children) - open_
        if open_ and not partial:
            lost = next(
                (
                    (i, c)
                    for i, c in enumerate(children)
                    if c is not None and c.status in (JobStatus.FAILED, JobStatus.CANCELLED)
                ),
                None,
            )
            if lost is not None:  # fail now, not after its siblings' hours of work
                from . import cancel_children

                await cancel_children(self._app, self.job_id)
                raise _child_failed(name, *lost)
        if open_:
            percent = round(100.0 * done / max(1, len(ids)), 2)
            message = f"{name}: {done}/{len(ids)} children done"
            changed = self._ctx.job.progress.message != message
            if changed:  # an event when something changed
                await self._ctx.emit(CHILDREN_EVENT, {"name": name, "total": len(ids), **counts})
                await self._ctx.progress(percent, message)
            self.parked = f"waiting for {open_} children of {name!r}"
            raise WaitForChildren(self.parked, after=self._next_poll(changed))
        if self._ctx.job.progress.message is not None:  # it reported waiting: say it's over
            await self._ctx.progress(100.0, f"{name}: {len(ids)}/{len(ids)} children done")
        results: list[Any] = []
        for index, child in enumerate(children):
            if child is not None and child.status == JobStatus.COMPLETED:
                results.append(child.result)
                continue
            if not partial and child is not None:
                raise _child_failed(name, index, child)
            results.append(None)
        await self._record(name, results)
        return results

    async def _rerun_ended(self, name: str, children: list[Job | None]) -> bool:
        """After a replay of the pipeline: run again the children of ``name`` that had failed
        or been cancelled (its failure cancels those still open), each with a fresh attempt
        budget, as a replay of each would. Once per replay: a child that fails again after it
        fails the pipeline again. True if any was run again."""
        assert self._rerun is not None
        done = self._rerun.setdefault(name, set())
        again = [
            child
            for child in children
            if child is not None
            and child.status in (JobStatus.FAILED, JobStatus.CANCELLED)
            and child.task_id not in done
        ]
        if not again:
            return False
        now = self._ctx.clock.now()

        async def rerun(child: Job) -> None:
            try:
                await self._app.backend.replay(
                    child.task_id,
                    now=now,
                    extra_attempts=self._app.replay_budget(child.type),
                    cancelled_too=True,
                )
            except (InvalidTransitionError, JobNotFoundError):
                pass  # rerun by an earlier run that died before its record, or expired: as is

        for start in range(0, len(again), _SPAWN_CHUNK):
            await asyncio.gather(*(rerun(child) for child in again[start : start + _SPAWN_CHUNK]))
        ids = [child.task_id for child in again]
        # Recorded after the replays: a run that dies before this may run one twice, never
        # none (a record first would let the next run take them as failed anew).
        await self._ctx.record(RERUN_EVENT, {"name": name, "children": ids})
        done.update(ids)
        return True

    def _next_poll(self, changed: bool) -> float:
        """When to look at the children again if none wakes it first: ``pipeline_poll_s``
        after a look that found something new, else twice as long as the last (at most a
        minute, or the poll if longer). Each look is a run with an attempt record and two
        events: a day's wait on children that take their time made 17,000 of them."""
        poll = self._app.settings.pipeline_poll_s
        if changed:
            return poll
        quiet = 0
        for record in reversed(self._ctx.job.history):
            if record.outcome is None:
                continue  # (this run's own, still open)
            if record.outcome != "waiting":
                break
            quiet += 1
        return float(min(max(poll, QUIET_POLL_CAP_S), poll * 2 ** min(quiet, 16)))

    def _as_child(self, metadata: list[dict[str, Any]] | None, index: int) -> dict[str, Any]:
        """What makes item ``index`` a child of this pipeline: its tenant, parent, metadata."""
        parent = self._ctx.job
        return {
            "tenant": parent.tenant,
            "parent_id": parent.task_id,
            "metadata": None if metadata is None else metadata[index],
        }

    def _check_children(
        self,
        name: str,
        task: str,
        inputs: list[dict[str, Any]],
        metadata: list[dict[str, Any]] | None,
        options: dict[str, Any],
    ) -> None:
        """Refuse, before any is enqueued, children that could never be: an unknown task, an
        item that does not fit it, a bad option. A mistake in the pipeline's code, so it
        fails the job at once (it was retried as if it might pass, after enqueueing the
        children before the bad one)."""
        taken = sorted(set(options) & _OWN_OPTIONS)
        if taken:
            raise PipelineDefinitionError(
                f"{name!r}: {', '.join(taken)} cannot be given: the pipeline sets them itself"
            )
        checked = {k: v for k, v in options.items() if k != "caller_traceparent"}  # (submit's)
        for index, item in enumerate(inputs):
            try:
                self._app.build_job(task, item, **self._as_child(metadata, index), **checked)
            except TypeError as exc:  # an option enqueue does not have
                raise PipelineDefinitionError(f"{name!r}: {exc}") from None
            except InvalidInputError as exc:
                raise PipelineDefinitionError(f"{name!r}[{index}]: {exc}") from None

    async def _enqueue(
        self,
        name: str,
        task: str,
        inputs: list[dict[str, Any]],
        metadata: list[dict[str, Any]] | None,
        options: dict[str, Any],
        *,
        partial: bool,
    ) -> list[str]:
        parent = self._ctx.job
        ids: list[str] = []
        for start in range(0, len(inputs), _SPAWN_CHUNK):

            async def one(index: int) -> str:
                job, _ = await self._app.submit(
                    task,
                    inputs[index],
                    limits=False,  # the pipeline was admitted; its children are its work
                    idempotency_key=_child_key(parent.task_id, name, index, partial=partial),
                    **self._as_child(metadata, index),
                    **options,
                )
                return job.task_id

            chunk = range(start, min(start + _SPAWN_CHUNK, len(inputs)))
            ids.extend(await asyncio.gather(*(one(i) for i in chunk)))
        if await self._app.backend.job_status(parent.task_id) == JobStatus.CANCELLED:
            # Cancelled while it spawned: the cancel's sweep of children may have run before
            # these existed.
            from . import cancel_children

            await cancel_children(self._app, parent.task_id)
        await self._ctx.record(SPAWN_EVENT, {"name": name, "children": ids, **self._place_of(name)})
        self._spawned[name] = ids
        return ids

    async def _read(self, ids: list[str], name: str, *, partial: bool) -> list[Job | None]:
        found: dict[str, Job] = {}
        cursor: str | None = None
        while True:
            page = await self._app.backend.list_jobs(
                parent_id=self.job_id, limit=1000, cursor=cursor
            )
            found.update((job.task_id, job) for job in page.jobs)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        missing = [i for i in ids if i not in found]
        # Expired (past their TTL), deleted, or unreadable (a listing leaves those out): not
        # coming back.
        if missing and not partial:
            raise ChildFailedError(
                f"child {missing[0]} of {name!r} is gone (expired, deleted or unreadable)"
                " before the pipeline read it",
                child_id=missing[0],
                step=name,
            )
        return [found.get(i) for i in ids]


def _child_failed(name: str, index: int, child: Job) -> ChildFailedError:
    reason = child.error.message if child.error is not None else child.status.value
    return ChildFailedError(
        f"child {child.task_id} ({name}[{index}], task {child.type!r}) {child.status.value}:"
        f" {reason}",
        child_id=child.task_id,
        step=name,
    )


def _task_name(task: str | Callable[..., Any]) -> str:
    if isinstance(task, str):
        return task
    name = getattr(task, "__backburner_task__", None) or getattr(task, "__name__", None)
    if not isinstance(name, str):
        raise PipelineDefinitionError(f"{task!r} is not a registered task")
    return name


def _child_input(definition: Any, item: Any) -> dict[str, Any]:
    if definition is None:
        if isinstance(item, dict):
            return item
        raise InvalidInputError(
            "an item of map must be a dict when the task is not registered here"
        )
    params = [p for p in list(definition.signature.parameters.values())[1:]]
    if len(params) == 1 and not (isinstance(item, dict) and set(item) <= {params[0].name}):
        return {params[0].name: item}
    if isinstance(item, dict):
        return item
    raise InvalidInputError(
        f"task {definition.name!r} takes {len(params)} parameters: give each item as a dict of them"
    )
