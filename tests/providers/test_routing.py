"""Model routing config, the simulator's failures, Retry-After parsing, and error records."""

from __future__ import annotations

import email.utils
import time
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner, Settings
from backburner.cli.service import _model_line
from backburner.errors import (
    ConfigurationError,
    ContextLengthExceededError,
    ModelNotFoundError,
    ProviderAuthError,
    ProviderUnavailableError,
    RateLimitedError,
    StreamInterruptedError,
)
from backburner.providers import GenerationRequest, ModelRouter, SimulatedProvider, Usage
from backburner.providers.base import parse_retry_after
from backburner.providers.openai import OpenAIProvider
from backburner.worker.retry import RetryPolicy

OPENAI = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1"}


def test_a_toml_file_routes_names_to_providers_with_fallbacks_and_prices(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        """
default_model = "fast"

[models.fast]
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
upstream = "gpt-4o-mini"
max_concurrent = 3
fallback = ["slow"]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.6

[models.slow]
provider = "simulated"
options = { tokens_per_s = 5 }
"""
    )
    router = ModelRouter.from_source(str(path))
    assert router.default_model == "fast"
    assert [r.name for r in router.chain(None)] == ["fast", "slow"]
    fast = router.route("fast")
    assert (fast.upstream, fast.max_concurrent) == ("gpt-4o-mini", 3)
    assert fast.cost_usd(Usage(1_000_000, 1_000_000)) == pytest.approx(0.75)
    assert router.route("slow").cost_usd(Usage(10, 10)) is None
    assert "simulated" in router.routes  # the built-in routes stay


def test_inline_json_in_the_environment_configures_the_app() -> None:
    settings = Settings(models='{"models": {"m": {"provider": "simulated"}}}', default_model="m")
    bb = Backburner("memory://", settings=settings)
    assert bb.models.default_model == "m" and bb.models.route(None).provider == "simulated"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"models": {"m": {"provider": "bard"}}}, "provider must be one of"),
        ({"models": {"m": {"provider": "openai"}}}, "base_url must be an http"),
        ({"models": {"m": {**OPENAI, "max_concurrent": 0}}}, "max_concurrent must be"),
        ({"models": {"m": {**OPENAI, "fallback": ["nope"]}}}, "not another model"),
        ({"models": {"m": {**OPENAI, "fallback": ["m"]}}}, "not another model"),
        ({"models": {"m": {**OPENAI, "input_usd_per_mtok": -1}}}, "must be a number >= 0"),
        ({"models": {"m": {**OPENAI, "colour": "red"}}}, "unknown keys"),
        ({"models": {"m": {**OPENAI, "options": {"tokens_per_s": 3}}}}, "provider openai takes"),
        ({"models": {"m": {"provider": "simulated", "options": {"fail": "x"}}}}, "fail must be"),
        ({"default_model": "ghost"}, "is not configured"),
        ({"models": {"m": {**OPENAI, "options": {"headers": ["x"]}}}}, "a table of strings"),
        ({"models": {"m": {**OPENAI, "options": {"read_timeout_s": "fast"}}}}, "seconds > 0"),
        ({"models": {"m": {"provider": "local", "options": {"threads": 0}}}}, "integer >= 1"),
        ({"modles": {}}, "unknown keys"),
    ],
)
def test_bad_routing_config_fails_loudly_with_a_clear_message(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ModelRouter(config)


def test_a_missing_or_broken_models_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the models file"):
        ModelRouter.from_source(str(tmp_path / "absent.toml"))
    broken = tmp_path / "broken.toml"
    broken.write_text("[models.x\n")
    with pytest.raises(ConfigurationError, match="is not valid"):
        ModelRouter.from_source(str(broken))
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        ModelRouter.from_source("{nope")


def test_an_unknown_model_and_an_unset_key_are_permanent_provider_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BB_TEST_KEY", raising=False)
    router = ModelRouter({"models": {"m": {**OPENAI, "api_key_env": "BB_TEST_KEY"}}})
    with pytest.raises(ModelNotFoundError, match="no model 'x' is configured"):
        router.route("x")
    with pytest.raises(ProviderAuthError, match="BB_TEST_KEY is unset"):
        router.provider(router.route("m"))


@pytest.mark.parametrize(
    ("fail", "error"),
    [
        ("rate_limit", RateLimitedError),
        ("server_error", ProviderUnavailableError),
        ("timeout", ProviderUnavailableError),
        ("context_overflow", ContextLengthExceededError),
        ("cut_stream", StreamInterruptedError),
    ],
)
async def test_the_simulator_injects_each_failure_then_recovers(
    fail: Any, error: type[Exception]
) -> None:
    sim = SimulatedProvider(
        time_to_first_token_s=0, tokens_per_s=10_000, fail=fail, fail_times=1, timeout_s=0.01
    )
    request = GenerationRequest(model="s", prompt="hello world", max_tokens=4)
    with pytest.raises(error):
        async for _ in sim.stream(request):
            pass
    items = [item async for item in sim.stream(request)]
    assert items[-1] == Usage(2, 4, "length")
    assert len(items) == 5


async def test_the_simulator_is_deterministic_and_paced() -> None:
    sim = SimulatedProvider(time_to_first_token_s=0.05, tokens_per_s=100)
    request = GenerationRequest(model="s", prompt="same prompt", max_tokens=10)
    started = time.monotonic()
    first = [i async for i in sim.stream(request)]
    elapsed = time.monotonic() - started
    second = [i async for i in sim.stream(request)]
    assert first == second
    assert elapsed >= 0.05 + 9 / 100 * 0.9


def test_retry_after_accepts_seconds_and_http_dates_and_refuses_junk() -> None:
    now = time.time()
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-3") == 0.0
    in_ten = email.utils.formatdate(now + 10, usegmt=True)
    assert parse_retry_after(in_ten, now=now) == pytest.approx(10, abs=1)
    past = email.utils.formatdate(now - 100, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("nan") is None
    for odd in ("inf", "infinity", "1_0", "0x10", "1e3", "\uff11\uff12", "+5", "5 s"):
        assert parse_retry_after(odd) is None, odd
    assert parse_retry_after(" 5 ") == 5.0
    day = 784111777.0  # 1994-11-06 08:49:37 GMT, RFC 9110's example, in each of its forms
    for form in ("Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT"):
        assert parse_retry_after(form, now=day - 30) == pytest.approx(30), form
    assert parse_retry_after("Sun Nov  6 08:49:37 1994", now=day - 30) == pytest.approx(30)
    assert parse_retry_after("1000000000") == 3600.0  # a header cannot park a job for years


def test_provider_errors_become_job_errors_with_their_own_type_and_wait() -> None:
    policy = RetryPolicy()
    error, delay = policy.classify(RateLimitedError("429", status=429, after=2.5), None)
    assert (error.type, error.retryable, delay) == ("rate_limited", True, 2.5)
    error, delay = policy.classify(ContextLengthExceededError("too long"), None)
    assert (error.type, error.retryable, delay) == ("context_length_exceeded", False, None)


async def test_a_key_read_with_its_trailing_newline_is_sent_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BB_TEST_KEY", "sk-from-a-file\n")
    router = ModelRouter({"models": {"m": {**OPENAI, "api_key_env": "BB_TEST_KEY"}}})
    provider = router.provider(router.route("m"))
    try:
        assert isinstance(provider, OpenAIProvider)
        assert provider._client.headers["authorization"] == "Bearer sk-from-a-file"
    finally:
        await router.aclose()


@pytest.mark.parametrize("url", ["httpfoo://x", "http://[::1", "http://"])
def test_a_base_url_must_be_http_or_https(url: str) -> None:
    with pytest.raises(ConfigurationError, match="base_url must be an http"):
        ModelRouter({"models": {"m": {**OPENAI, "base_url": url}}})


def test_the_serve_banner_names_a_model_url_without_its_password(tmp_path: Path) -> None:
    route = {**OPENAI, "base_url": "https://al:hunter2@llm.test/v1"}
    models = ModelRouter({"default_model": "m", "models": {"m": route}})
    bb = Backburner(f"sqlite:///{tmp_path / 'b.db'}", models=models)
    line = _model_line(bb)
    assert "hunter2" not in line and "al:" not in line and "https://llm.test/v1" in line
