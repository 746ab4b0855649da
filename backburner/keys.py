"""API keys: making them, storing only their hashes, and finding the tenant of a key.

A key is ``bb_`` + 43 URL-safe characters (256 random bits). Only its SHA-256 is kept: in the
keys file (``backburner keys create``), or in ``api_keys`` / ``admin_keys`` as
``TENANT:sha256:HEX``; a plain ``TENANT:KEY`` there is hashed when read. Keys carry 256 bits, so
a fast hash is enough: nobody can search that space.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .backends.base import DEFAULT_TENANT, check_tenant
from .errors import ConfigurationError, InvalidInputError
from .settings import Settings

log = logging.getLogger("backburner.keys")

KEY_PREFIX = "bb_"
_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""What a key may look like: RFC 6750's b64token, all a Bearer header can carry."""


def check_key_tenant(tenant: str) -> str:
    """``tenant`` if a key may act for it (ConfigurationError if not). ``default`` is reserved
    for library calls and the keyless API: it has no limits, and its idempotency keys are not
    namespaced, so a key for it would reach past other tenants' keys."""
    try:
        check_tenant(tenant)
    except InvalidInputError as exc:
        raise ConfigurationError(str(exc)) from None
    if tenant == DEFAULT_TENANT:
        raise ConfigurationError(
            f"the tenant {DEFAULT_TENANT!r} is reserved for library calls and the keyless API;"
            " give the key a tenant of its own"
        )
    return tenant


RELOAD_EVERY_S = 1.0
"""How often the keys file's modification time is looked at."""


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant of their key, and whether it is an admin key."""

    tenant: str
    admin: bool = False
    key_id: str | None = None


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A key as the keys file holds it (no key, only its hash)."""

    id: str
    tenant: str
    hash: str
    admin: bool = False
    created_at: float = 0.0
    name: str | None = None


_KEY_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "tenant": (str,),
    "hash": (str,),
    "admin": (bool,),
    "created_at": (int, float),
    "name": (str, type(None)),
}


_YEAR_10000 = 253402300800.0
"""The first Unix time a datetime cannot show: a created_at past it ended keys list."""


def _stored_key(entry: Any) -> StoredKey:
    """A keys-file entry, each field of its own type: ``"admin": "false"`` (any text) had
    made a tenant's key an admin's."""
    if not isinstance(entry, dict):
        raise ValueError(f"an entry must be an object, got {type(entry).__name__}")
    unknown = set(entry) - set(_KEY_FIELDS)
    if unknown:
        raise ValueError(f"an entry has unknown fields {sorted(unknown)}")
    for name in ("id", "tenant", "hash"):
        if name not in entry:
            raise ValueError(f"an entry lacks {name!r}")
    for name, value in entry.items():
        wanted = _KEY_FIELDS[name]
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            kinds = " or ".join("null" if t is type(None) else t.__name__ for t in wanted)
            raise ValueError(f"{name!r} of {entry.get('id')!r} must be {kinds}, got {value!r}")
    if not 0 <= entry.get("created_at", 0.0) < _YEAR_10000:  # (NaN too)
        raise ValueError(f"'created_at' of {entry['id']!r} must be a Unix time (seconds)")
    return StoredKey(**entry)


class KeysFile:
    """The JSON file ``backburner keys create`` writes: ``{"keys": [StoredKey, ...]}``.

    Writes replace the file atomically (mode 0600) under an exclusive lock, so two
    ``keys create`` at once both land."""

    def __init__(self, path: str | Path) -> None:
        try:
            self.path = Path(path).expanduser()
        except RuntimeError as exc:  # (~nosuchuser)
            raise ConfigurationError(f"cannot use the keys file {path}: {exc}") from None

    def read(self) -> list[StoredKey]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ConfigurationError(f"cannot read the keys file {self.path}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigurationError(
                f"cannot read the keys file {self.path}: not UTF-8 text (byte {exc.start})"
            ) from None
        try:
            data = json.loads(text)
            entries = data["keys"] if isinstance(data, dict) else None
            if not isinstance(entries, list):
                raise ValueError('it must be {"keys": [...]}')
            keys = [_stored_key(entry) for entry in entries]
        except (ValueError, KeyError, RecursionError) as exc:
            raise ConfigurationError(f"the keys file {self.path} is not valid: {exc}") from None
        for key in keys:
            if not _HASH.fullmatch(key.hash):
                raise ConfigurationError(f"the keys file {self.path} has a bad hash for {key.id}")
            try:
                check_key_tenant(key.tenant)
            except ConfigurationError as exc:
                raise ConfigurationError(f"the keys file {self.path}, {key.id}: {exc}") from None
        return keys

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _write(self, keys: list[StoredKey]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}")
        body = json.dumps({"keys": [asdict(k) for k in keys]}, indent=2) + "\n"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(body)
        os.replace(tmp, self.path)

    def create(self, tenant: str, *, admin: bool = False, name: str | None = None) -> str:
        """Store a new key's hash for ``tenant``; return the key (it is not kept anywhere)."""
        check_key_tenant(tenant)
        key = new_key()
        entry = StoredKey(
            id="key_" + secrets.token_hex(6),
            tenant=tenant,
            hash=key_hash(key),
            admin=admin,
            created_at=round(time.time(), 3),
            name=name,
        )
        with self._locked():
            self._write([*self.read(), entry])
        return key

    def revoke(self, key_id: str) -> bool:
        """Remove the key with this id; False if there is none."""
        with self._locked():
            keys = self.read()
            kept = [k for k in keys if k.id != key_id]
            if len(kept) == len(keys):
                return False
            self._write(kept)
        return True


def _parse_entries(raw: str | None, setting: str, *, admin: bool) -> dict[str, Principal]:
    found: dict[str, Principal] = {}
    for number, part in enumerate((raw or "").split(","), 1):
        entry = part.strip()
        if not entry:
            continue
        tenant, sep, secret = entry.partition(":")
        if not sep or not secret:
            raise ConfigurationError(f"{setting} entry {number} must be TENANT:KEY")
        try:
            check_key_tenant(tenant)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{setting} entry {number}: {exc}") from None
        if secret.startswith("sha256:"):
            if not _HASH.fullmatch(secret):
                raise ConfigurationError(
                    f"{setting} entry {number}: sha256: must be followed by 64 hex digits"
                )
            digest = secret
        elif not _TOKEN.fullmatch(secret):
            raise ConfigurationError(
                f"{setting} entry {number}: a key may hold only letters, digits and - . _ ~ + /"
                " (what an Authorization: Bearer header can carry)"
            )
        else:
            digest = key_hash(secret)
        found[digest] = Principal(tenant=tenant, admin=admin, key_id=f"{setting}#{number}")
    return found


class KeyRing:
    """Every key the API accepts, from the settings and the keys file (re-read when it
    changes). ``open`` is True when none is configured: then every caller is the ``default``
    tenant with admin rights (local development)."""

    def __init__(self, settings: Settings) -> None:
        self._static = _parse_entries(settings.api_keys, "api_keys", admin=False)
        self._static.update(_parse_entries(settings.admin_keys, "admin_keys", admin=True))
        self._file = KeysFile(settings.keys_file) if settings.keys_file else None
        self._from_file: dict[str, Principal] = {}
        self._file_stamp: Any = None
        self._checked_at = float("-inf")
        self.open = not self._static and self._file is None
        self._reload(force=True)
        if self._file is not None and self._file_stamp is None and not self._static:
            log.warning(
                "the keys file %s does not exist: no API key is accepted (every request gets"
                " 401) until `backburner keys create` writes it",
                self._file.path,
            )

    def _reload(self, *, force: bool = False) -> None:
        if self._file is None:
            return
        now = time.monotonic()
        if not force and now - self._checked_at < RELOAD_EVERY_S:
            return
        self._checked_at = now
        try:
            info = self._file.path.stat()
            stamp: Any = (info.st_mtime_ns, info.st_size, info.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp == self._file_stamp and not force:
            return
        try:
            stored = self._file.read()
        except ConfigurationError as exc:
            if force:
                raise
            log.warning("keeping the keys read before: %s", exc)
            return
        self._from_file = {
            k.hash: Principal(tenant=k.tenant, admin=k.admin, key_id=k.id) for k in stored
        }
        self._file_stamp = stamp

    def lookup(self, key: str) -> Principal | None:
        """The caller a key belongs to, or None for a key nobody issued."""
        self._reload()
        digest = key_hash(key)
        return self._static.get(digest) or self._from_file.get(digest)
