"""Standard Webhooks signing and verification, checked against the reference library."""

from __future__ import annotations

import base64
import string
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest
import standardwebhooks
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from backburner.errors import ConfigurationError, WebhookVerificationError
from backburner.webhooks import generate_secret, sign, verify
from backburner.webhooks.signing import signature

# The reference libraries' own test vector (svix / standard-webhooks).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET = generate_secret()
OTHER = generate_secret()
TS = 1_700_000_000
BODY = b'{"type":"task.completed","data":{"task_id":"task_1"}}'


def headers(secret: str | list[str] = SECRET, body: bytes = BODY, ts: int = TS) -> dict[str, str]:
    return sign(secret, "msg_0123456789abcdef", ts, body)


def rejected(
    hdrs: dict[str, str], body: bytes | str = BODY, secret: str | list[str] = SECRET, **kw: float
) -> str:
    kw.setdefault("now", TS)
    with pytest.raises(WebhookVerificationError) as info:
        verify(secret, hdrs, body, **kw)
    message = str(info.value)
    for s in [SECRET, OTHER, *([secret] if isinstance(secret, str) else secret)]:
        assert s.removeprefix("whsec_") not in message
    return message


# -- the fixed vector and agreement with the reference library -------------------------------


def test_fixed_vector() -> None:
    assert signature(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG
    bare = VECTOR_SECRET.removeprefix("whsec_")
    assert signature(bare, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG
    assert sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TS),
        "webhook-signature": VECTOR_SIG,
    }
    reference = standardwebhooks.Webhook(VECTOR_SECRET).sign(
        VECTOR_ID, datetime.fromtimestamp(VECTOR_TS, tz=UTC), VECTOR_BODY.decode()
    )
    assert reference == VECTOR_SIG
    vector_headers = sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    assert verify(VECTOR_SECRET, vector_headers, VECTOR_BODY, now=VECTOR_TS) == VECTOR_TS


def _reference_headers(secret: str, msg_id: str, ts: int, body: str) -> dict[str, str]:
    sig = standardwebhooks.Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, tz=UTC), body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": sig}


def test_ours_verifies_with_reference_and_back() -> None:
    now = int(time.time())  # the reference library checks against the real clock
    body = '{"ünïcode": "✓"}'
    ours = sign([OTHER, SECRET], "msg_abc", now, body.encode())
    assert standardwebhooks.Webhook(SECRET).verify(body, ours, json_parse=False) is None
    assert standardwebhooks.Webhook(OTHER).verify(body.encode(), ours) == {"ünïcode": "✓"}
    theirs = _reference_headers(SECRET, "msg_abc", now, body)
    assert verify(SECRET, theirs, body.encode(), now=now) == now
    assert verify(SECRET, theirs, body, now=now) == now


MSG_IDS = st.text(
    alphabet=st.sampled_from(sorted(set(string.printable) - set(string.whitespace) - {"."})),
    min_size=1,
    max_size=40,
)
KEYS = st.binary(min_size=24, max_size=64)


@settings(max_examples=100, deadline=None)
@given(
    key=KEYS,
    prefixed=st.booleans(),
    msg_id=MSG_IDS,
    body=st.text(max_size=300),
    skew=st.integers(min_value=-60, max_value=60),
)
def test_agreement_with_reference_property(
    key: bytes, prefixed: bool, msg_id: str, body: str, skew: int
) -> None:
    secret = ("whsec_" if prefixed else "") + base64.b64encode(key).decode()
    ts = int(time.time()) + skew
    ours = sign(secret, msg_id, ts, body.encode())
    standardwebhooks.Webhook(secret).verify(body, ours, json_parse=False)
    theirs = _reference_headers(secret, msg_id, ts, body)
    assert theirs == ours
    assert verify(secret, theirs, body.encode()) == ts


# -- verify rejects ---------------------------------------------------------------------------


def test_rejects_tampered_body() -> None:
    tampered = bytearray(BODY)
    tampered[10] ^= 0x01
    assert "no v1 signature" in rejected(headers(), bytes(tampered))


def test_rejects_wrong_secret() -> None:
    assert "matches" in rejected(headers(OTHER))
    assert "matches" in rejected(headers(), secret=[OTHER])


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_rejects_missing_header(name: str) -> None:
    hdrs = headers()
    del hdrs[name]
    assert name in rejected(hdrs)
    assert name in rejected({**hdrs, name: ""})


@pytest.mark.parametrize("value", ["abc", "1700000000.5", "1e9", "0x10", "", " "])
def test_rejects_non_integer_timestamp(value: str) -> None:
    message = rejected({**headers(), "webhook-timestamp": value})
    assert "webhook-timestamp" in message


def test_rejects_too_old_and_future() -> None:
    hdrs = headers()
    assert verify(SECRET, hdrs, BODY, now=TS + 300) == TS  # the bounds are inclusive
    assert verify(SECRET, hdrs, BODY, now=TS - 300) == TS
    assert "too old" in rejected(hdrs, now=TS + 301)
    assert "in the future" in rejected(hdrs, now=TS - 301)
    assert "too old" in rejected(hdrs, now=TS + 11, tolerance=10)
    assert verify(SECRET, hdrs, BODY, now=TS + 11, tolerance=20) == TS


def test_rejects_other_versions_only() -> None:
    hdrs = headers()
    sig = hdrs["webhook-signature"].removeprefix("v1,")
    for value in [f"v1a,{sig}", f"v2,{sig}", sig, f"V1,{sig}", "v1,", "v1,!!not-base64!!"]:
        assert "no v1 signature" in rejected({**hdrs, "webhook-signature": value})


def test_rejects_negative_tolerance() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        verify(SECRET, headers(), BODY, tolerance=-1, now=TS)
    with pytest.raises(ValueError, match="tolerance"):
        verify(SECRET, headers(), BODY, tolerance=float("nan"), now=TS)


# -- verify accepts ---------------------------------------------------------------------------


def test_accepts_second_of_several_signatures() -> None:
    good = headers()["webhook-signature"]
    bogus = signature(OTHER, "msg_0123456789abcdef", TS, BODY)
    sigs = f"v1a,abcd junk v1,!!! {bogus}  {good}"
    assert verify(SECRET, {**headers(), "webhook-signature": sigs}, BODY, now=TS) == TS


def test_rotation_signs_with_each_secret_in_order() -> None:
    hdrs = headers([OTHER, SECRET])
    first, second = hdrs["webhook-signature"].split(" ")
    assert first == signature(OTHER, "msg_0123456789abcdef", TS, BODY)
    assert second == signature(SECRET, "msg_0123456789abcdef", TS, BODY)
    assert verify(SECRET, hdrs, BODY, now=TS) == TS
    assert verify(OTHER, hdrs, BODY, now=TS) == TS


def test_accepts_when_second_of_two_secrets_matches() -> None:
    assert verify([OTHER, SECRET], headers(SECRET), BODY, now=TS) == TS
    assert verify((SECRET, OTHER), headers(OTHER), BODY, now=TS) == TS
    # As the setting holds them during a rotation: one string, space-separated.
    assert verify(f"{OTHER} {SECRET}", headers(SECRET), BODY, now=TS) == TS
    assert verify(f" {SECRET}  {OTHER}\n", headers(OTHER), BODY, now=TS) == TS


def test_accepts_mixed_case_header_names() -> None:
    hdrs = headers()
    mixed = {
        "Webhook-Id": hdrs["webhook-id"],
        "WEBHOOK-TIMESTAMP": hdrs["webhook-timestamp"],
        "Webhook-Signature": hdrs["webhook-signature"],
        "Content-Type": "application/json",
    }
    assert verify(SECRET, mixed, BODY, now=TS) == TS
    assert verify(SECRET, httpx.Headers(mixed), BODY, now=TS) == TS
    raw = [(k.lower().encode(), v.encode()) for k, v in mixed.items()]
    assert verify(SECRET, Headers(raw=raw), BODY, now=TS) == TS


def test_accepts_str_body() -> None:
    body = '{"text": "héllo ✓"}'
    assert verify(SECRET, headers(body=body.encode()), body, now=TS) == TS


# -- secrets ----------------------------------------------------------------------------------


def test_generate_secret_round_trips() -> None:
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 32
    assert secret != generate_secret()
    assert verify(secret, sign(secret, "msg_1", TS, BODY), BODY, now=TS) == TS
    standardwebhooks.Webhook(secret).verify(BODY, sign(secret, "msg_1", int(time.time()), BODY))


MALFORMED = [
    "whsec_this is not base64 at all!!",
    "whsec_" + base64.b64encode(b"short-key-10").decode(),  # 12 bytes: too short
    "whsec_" + base64.b64encode(bytes(range(65))).decode(),  # 65 bytes: too long
    "whsec_ZmFrZV9zZWNyZXRfd2l0aF/DqW1vamlfw6k=é",  # not ASCII
    "whsec_" + base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode(),  # url-safe alphabet
    "whsec_",
]


@pytest.mark.parametrize("secret", MALFORMED)
def test_malformed_secret_raises_configuration_error(secret: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: sign(secret, "msg_1", TS, BODY),
        lambda: sign([SECRET, secret], "msg_1", TS, BODY),
        lambda: signature(secret, "msg_1", TS, BODY),
        lambda: verify(secret, headers(), BODY, now=TS),
        lambda: verify([SECRET, secret], headers(), BODY, now=TS),
    ]
    for call in calls:
        with pytest.raises(ConfigurationError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message
        if secret != "whsec_":
            assert secret not in message
            assert secret.removeprefix("whsec_") not in message


def test_sign_refuses_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match="no webhook secret"):
        sign([], "msg_1", TS, BODY)
    with pytest.raises(ConfigurationError, match="no webhook secret"):
        verify([], headers(), BODY, now=TS)
    for msg_id in ["", "msg 1", "msg\t1", "msg\n1", "msg.1", "msg\x001"]:
        with pytest.raises(ValueError, match="msg_id"):
            sign(SECRET, msg_id, TS, BODY)
    for ts in [-1, True, 1.5]:
        with pytest.raises(ValueError, match="timestamp"):
            sign(SECRET, "msg_1", ts, BODY)  # type: ignore[arg-type]
