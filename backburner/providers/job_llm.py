"""``ctx.llm``: model calls from inside a job, with routing, limits, live tokens and accounting."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import (
    ProviderError,
    ProviderRequestError,
    QuotaExhaustedError,
    RateLimitedError,
)
from .base import GenerationRequest, Usage, estimate_tokens, generation_args
from .routing import ModelRoute, ModelRouter
from .slots import model_slot
from .token_events import TokenEvents

if TYPE_CHECKING:
    from ..context import JobContext


@dataclass(frozen=True, slots=True)
class Generation:
    """What one model call produced and consumed."""

    text: str
    model: str
    """The route's name (what the caller asked for, or the fallback that served it)."""
    provider: str
    usage: Usage
    time_to_first_token_s: float | None
    tokens_per_s: float | None
    cost_usd: float | None

    @property
    def simulated(self) -> bool:
        return self.provider == "simulated"


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """How long a model slot's lease lasts, and how often it is renewed."""

    lease_s: float = 30.0
    renew_s: float = 10.0


class JobLLM:
    """Model calls bound to one running job: ``await ctx.llm.generate(...)``."""

    def __init__(self, ctx: JobContext, router: ModelRouter, limits: LimitSettings) -> None:
        self._ctx = ctx
        self._router = router
        self._limits = limits

    def pick(self, model: str | None) -> tuple[ModelRoute, ModelRoute | None]:
        """The route this attempt uses, and the fallback the next attempt would go to.

        Attempt n takes the n-th model of [model, *fallback] (round the list again past its
        end), so after a retryable failure the next attempt goes to the next model. The
        second item is None when the next attempt starts the list again (or there is none).
        """
        chain = self._router.chain(model)
        index = (self._ctx.attempt - 1) % len(chain)
        return chain[index], chain[index + 1] if index + 1 < len(chain) else None

    async def generate(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        model: str | None = None,
        max_tokens: int = 256,
        temperature: float | None = None,
        stop: Sequence[str] = (),
        events: bool = True,
    ) -> Generation:
        """Call a model and return the whole text.

        With ``events`` each delta is appended to the job's events as ``token``
        (``{"text", "attempt", "model"}``) as it arrives, with a progress update every few
        tokens. The call's usage is added to the job's (tokens and cost summed over calls).
        Provider failures raise ``ProviderError`` subclasses, which the retry policy reads.
        """
        parts: list[str] = []
        run = self._run(prompt, messages, model, max_tokens, temperature, stop, events)
        async with contextlib.aclosing(run) as items:
            async for item in items:
                if isinstance(item, str):
                    parts.append(item)
                else:
                    return dataclasses.replace(item, text="".join(parts))
        raise AssertionError("a model call ended without its result")  # pragma: no cover

    async def stream(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        model: str | None = None,
        max_tokens: int = 256,
        temperature: float | None = None,
        stop: Sequence[str] = (),
        events: bool = True,
    ) -> AsyncIterator[str]:
        """Like ``generate``, but yields the text deltas as they arrive."""
        run = self._run(prompt, messages, model, max_tokens, temperature, stop, events)
        async with contextlib.aclosing(run) as items:
            async for item in items:
                if isinstance(item, str):
                    yield item

    async def _run(
        self,
        prompt: str | None,
        messages: Sequence[Mapping[str, Any]] | None,
        model: str | None,
        max_tokens: int,
        temperature: float | None,
        stop: Sequence[str],
        events: bool,
    ) -> AsyncGenerator[str | Generation, None]:
        """The deltas, then the call's Generation (with no text: the caller joins it)."""
        # Bad arguments fail the job at once: a retry would send the same ones.
        try:
            chat, stop = generation_args(prompt, messages, max_tokens, temperature, stop)
        except ValueError as exc:
            raise ProviderRequestError(str(exc)) from None
        route, fallback = self.pick(model)
        request = GenerationRequest(
            model=route.upstream,
            messages=chat,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
        )
        provider = self._router.provider(route)
        ctx = self._ctx
        slot: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
        if route.max_concurrent is not None:
            slot = model_slot(
                ctx.backend,
                ctx.clock,
                route.name,
                route.max_concurrent,
                owner=f"{ctx.job_id}:{ctx.fence}",
                lease_s=self._limits.lease_s,
                renew_s=self._limits.renew_s,
            )
        produced = 0
        usage: Usage | None = None
        first_token_s: float | None = None
        sink = TokenEvents(ctx, route.name, max_tokens) if events else None
        async with slot:
            traced = ctx.tracing.llm_call(ctx.job_id, provider.kind, route.upstream, max_tokens)
            with traced as span_data:
                started = time.monotonic()
                try:
                    async with contextlib.aclosing(provider.stream(request)) as items:
                        async for item in items:
                            if isinstance(item, Usage):
                                usage = item
                                continue
                            if first_token_s is None:
                                first_token_s = time.monotonic() - started
                            produced += 1
                            if sink is not None:
                                sink.add(item)
                            yield item
                    if sink is not None:
                        await sink.flush()
                except ProviderError as exc:
                    if sink is not None:
                        await sink.flush()  # the partial text stays in the job's events
                    job = ctx.job
                    moves = exc.retryable or isinstance(exc, QuotaExhaustedError)
                    if moves and fallback is not None and job.attempts < job.max_attempts:
                        # The next attempt goes to another model: this one's wait is not its
                        # wait, and its spent quota is not the other's (a 429: rate_limited).
                        again = type(exc) if exc.retryable else RateLimitedError
                        raise again(
                            f"{exc} (the next attempt goes to model {fallback.name!r})",
                            status=exc.status,
                            after=0.0,
                        ) from None
                    raise
                except GeneratorExit:
                    # The caller stopped reading: a normal end. Its tokens were made (and billed).
                    if sink is not None:
                        with contextlib.suppress(Exception):
                            await sink.flush()
                    estimate = Usage(
                        estimate_tokens("".join(m.content for m in request.as_messages())),
                        produced,
                        "stopped",
                        estimated=True,
                    )
                    self._account(
                        self._result(
                            route, provider.kind, estimate, started, produced, first_token_s
                        )
                    )
                    raise
                except Exception:
                    if sink is not None:
                        await sink.flush()
                    raise
                except BaseException:  # cancelled: nothing more may be written
                    if sink is not None:
                        sink.abandon()
                    raise
                if usage is not None:
                    span_data["gen_ai.usage.input_tokens"] = usage.input_tokens
                    span_data["gen_ai.usage.output_tokens"] = usage.output_tokens
                    if usage.finish_reason:
                        span_data["gen_ai.response.finish_reasons"] = [usage.finish_reason]
        if usage is None:  # a provider that broke the Protocol: count what came
            usage = Usage(0, produced, None, estimated=True)
        result = self._result(route, provider.kind, usage, started, produced, first_token_s)
        self._account(result)
        yield result

    @staticmethod
    def _result(
        route: ModelRoute,
        kind: str,
        usage: Usage,
        started: float,
        produced: int,
        first_token_s: float | None,
    ) -> Generation:
        elapsed = time.monotonic() - started
        return Generation(
            text="",
            model=route.name,
            provider=kind,
            usage=usage,
            time_to_first_token_s=None if first_token_s is None else round(first_token_s, 4),
            tokens_per_s=round(produced / elapsed, 2) if elapsed > 0 and produced else None,
            cost_usd=route.cost_usd(usage),
        )

    def _account(self, result: Generation) -> None:
        usage = self._ctx.usage
        extra: dict[str, Any] = {
            "model": result.model,
            "provider": result.provider,
            "calls": usage.get("calls", 0) + 1,
            "time_to_first_token_s": result.time_to_first_token_s,
            "tokens_per_s": result.tokens_per_s,
        }
        if result.cost_usd is not None:
            extra["cost_usd"] = round(usage.get("cost_usd", 0.0) + result.cost_usd, 8)
        if result.usage.estimated:
            extra["estimated"] = True
        self._ctx.add_usage(
            input_tokens=result.usage.input_tokens,
            output_tokens=result.usage.output_tokens,
            **extra,
        )
