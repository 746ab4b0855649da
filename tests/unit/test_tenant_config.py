"""Tenant policies from config, API keys from settings and the keys file, the keys CLI."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backburner import Settings
from backburner.backends.base import Quota, fair_cost
from backburner.cli.main import build_cli
from backburner.errors import ConfigurationError, InvalidInputError
from backburner.keys import KeyRing, KeysFile, Principal, key_hash
from backburner.tenants import TenantPolicies, TenantPolicy


def test_defaults_and_the_default_tenant() -> None:
    policies = TenantPolicies.from_source(None)
    acme = policies.policy("acme")
    assert (acme.max_in_flight, acme.submissions_per_minute, acme.weight) == (5, 600, 1.0)
    assert acme.quota() == Quota(max_in_flight=5, per_minute=600)
    default = policies.policy("default")
    assert default.quota() is None and default.weight == 1.0


def test_a_config_sets_defaults_and_tenants(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        "[defaults]\nmax_in_flight = 10\nweight = 2\n\n"
        "[tenants.acme]\nmax_in_flight = 0\nsubmissions_per_minute = 30\n\n"
        "[tenants.default]\nmax_in_flight = 3\n"
    )
    policies = TenantPolicies.from_source(str(path))
    assert policies.policy("other") == TenantPolicy(max_in_flight=10, weight=2.0)
    acme = policies.policy("acme")
    assert (acme.max_in_flight, acme.submissions_per_minute, acme.weight) == (None, 30, 2.0)
    assert acme.fair_cost == fair_cost(2)
    assert policies.policy("default").max_in_flight == 3
    inline = TenantPolicies.from_source('{"tenants": {"x": {"weight": 0.5}}}')
    assert inline.policy("x").weight == 0.5


def test_a_priority_cap_refuses_what_is_asked_and_lowers_a_tasks_default() -> None:
    policies = TenantPolicies.from_source(
        '{"defaults": {"max_priority": 0}, "tenants": {"vip": {"max_priority": 100},'
        ' "low": {"max_priority": -20}}}'
    )
    assert policies.policy("acme").max_priority == 0  # (0 is a priority, not "no limit")
    assert policies.check_priority("acme", 0, asked=True) == 0
    assert policies.check_priority("acme", -5, asked=True) == -5
    with pytest.raises(InvalidInputError, match=r"priority 10 is above .* \(0\)"):
        policies.check_priority("acme", 10, asked=True)
    assert policies.check_priority("acme", 10, asked=False) == 0  # a task's own default
    assert policies.check_priority("vip", 100, asked=True) == 100
    assert policies.check_priority("low", -10, asked=False) == -20
    assert policies.policy("default").max_priority is None  # the library's: no table of its own


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ('{"defaults": {"max_inflight": 5}}', "unknown keys"),
        ('{"defaults": {"max_in_flight": -1}}', "integer >= 0"),
        ('{"defaults": {"max_in_flight": true}}', "integer >= 0"),
        ('{"defaults": {"weight": 0}}', "weight"),
        ('{"defaults": {"max_priority": 101}}', "from -100 to 100"),
        ('{"defaults": {"max_priority": 1.5}}', "from -100 to 100"),
        ('{"tenants": {"bad name": {}}}', "tenant name"),
        ('{"tenants": {"acme": 5}}', "must be a table"),
        ('{"quotas": {}}', "unknown tables"),
        ("{not json", "not valid JSON"),
        ("/no/such/tenants.toml", "cannot read"),
    ],
)
def test_a_bad_config_fails_loudly(config: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        TenantPolicies.from_source(config)


def test_keys_from_settings_plain_or_hashed() -> None:
    ring = KeyRing(
        Settings(
            api_keys=f"acme:bb_one, globex:{key_hash('bb_two')}",
            admin_keys="ops:bb_root",
        )
    )
    assert not ring.open
    assert ring.lookup("bb_one") == Principal("acme", False, "api_keys#1")
    assert ring.lookup("bb_two") == Principal("globex", False, "api_keys#2")
    assert ring.lookup("bb_root") == Principal("ops", True, "admin_keys#1")
    assert ring.lookup("bb_three") is None
    assert ring.lookup(key_hash("bb_one")) is None
    assert KeyRing(Settings()).open


@pytest.mark.parametrize(
    "entry",
    [
        "acme",
        "acme:",
        ":bb_key",
        "bad name:bb_key",
        "acme:sha256:abc",
        "acme:my key!",
        "default:bb_key",
    ],
)
def test_bad_key_entries_fail_loudly(entry: str) -> None:
    with pytest.raises(ConfigurationError):
        KeyRing(Settings(api_keys=entry))


def test_the_keys_file_keeps_hashes_and_survives_concurrent_creates(tmp_path: Path) -> None:
    keys = KeysFile(tmp_path / "sub" / "keys.json")
    made: list[str] = []
    threads = [
        threading.Thread(target=lambda i=i: made.append(keys.create(f"t{i}"))) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = keys.read()
    assert sorted(k.tenant for k in stored) == [f"t{i}" for i in range(8)]
    text = keys.path.read_text()
    assert all(key not in text for key in made)
    assert {k.hash for k in stored} == {key_hash(key) for key in made}
    ring = KeyRing(Settings(keys_file=str(keys.path)))
    found = [ring.lookup(key) for key in made]
    assert {p.tenant for p in found if p is not None} == {f"t{i}" for i in range(8)}


def test_a_broken_keys_file_fails_at_start_and_is_ignored_later(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text("{broken")
    with pytest.raises(ConfigurationError, match="not valid"):
        KeyRing(Settings(keys_file=str(path)))
    keys = KeysFile(path)
    path.unlink()
    key = keys.create("acme")
    ring = KeyRing(Settings(keys_file=str(path)))
    path.write_text(json.dumps({"keys": [{"id": "x"}]}))
    ring._checked_at = float("-inf")  # look at the file again now, not in a second
    kept = ring.lookup(key)  # the keys read before stay while the file is broken
    assert kept is not None and kept.tenant == "acme"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"admin": "false"}, "'admin' of 'k1' must be bool"),  # any text had made it an admin
        ({"admin": 1}, "must be bool"),
        ({"hash": 5}, "'hash' of 'k1' must be str"),
        ({"created_at": "yesterday"}, "must be int or float"),
        ({"created_at": True}, "must be int or float"),
        ({"created_at": float("nan")}, "a Unix time"),
        ({"created_at": 1e20}, "a Unix time"),  # keys list ended in an OverflowError
        ({"created_at": -5}, "a Unix time"),
        ({"name": ["x"]}, "must be str or null"),
        ({"role": "admin"}, "unknown fields ['role']"),
    ],
)
def test_each_field_of_the_keys_file_has_its_type(
    tmp_path: Path, change: dict[str, Any], complaint: str
) -> None:
    path = tmp_path / "keys.json"
    keys = KeysFile(path)
    key = keys.create("acme")
    data = json.loads(path.read_text())
    data["keys"][0].update({"id": "k1", **change})
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match=re.escape(complaint)):
        keys.read()
    with pytest.raises(ConfigurationError, match="not valid"):
        KeyRing(Settings(keys_file=str(path)))
    path.write_text(json.dumps({"keys": [{**data["keys"][0], **{"admin": False}}]}))
    if "admin" in change:  # the same entry, well typed: the tenant's key, not an admin's
        principal = KeyRing(Settings(keys_file=str(path))).lookup(key)
        assert principal is not None and principal.admin is False


def test_the_keys_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    cli = build_cli()
    path = str(tmp_path / "keys.json")
    made = runner.invoke(cli, ["keys", "create", "--tenant", "acme", "--keys-file", path])
    assert made.exit_code == 0, made.output
    key = made.stdout.strip().splitlines()[0]
    assert key.startswith("bb_")
    admin = runner.invoke(
        cli,
        ["keys", "create", "--tenant", "ops", "--admin", "--name", "on call"],
        env={"BACKBURNER_KEYS_FILE": path},
    )
    assert admin.exit_code == 0
    listed = runner.invoke(cli, ["keys", "list", "--keys-file", path])
    assert "tenant=acme" in listed.stdout and "admin" in listed.stdout
    assert key not in listed.stdout
    (acme,) = [k for k in KeysFile(path).read() if k.tenant == "acme"]
    gone = runner.invoke(cli, ["keys", "revoke", acme.id, "--keys-file", path])
    assert gone.exit_code == 0 and [k.tenant for k in KeysFile(path).read()] == ["ops"]
    again = runner.invoke(cli, ["keys", "revoke", acme.id, "--keys-file", path])
    assert again.exit_code == 1 and "no key" in again.output
    bad = runner.invoke(cli, ["keys", "create", "--tenant", "bad name", "--keys-file", path])
    assert bad.exit_code == 2 and "tenant name" in bad.output
    reserved = runner.invoke(cli, ["keys", "create", "--tenant", "default", "--keys-file", path])
    assert reserved.exit_code == 2 and "reserved" in reserved.output
    assert "Traceback" not in bad.output
