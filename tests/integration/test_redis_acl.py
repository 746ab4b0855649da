"""A Redis user restricted by ACLs: one that may not use the prefix's channels is refused at
connect, in a sentence that says what to grant (it was let in, and every enqueue was stored,
then answered as failed)."""

from __future__ import annotations

import pytest
from redis import Redis

from backburner.backends import backend_from_url
from backburner.errors import BackendError

from ..chaos.support import RedisServer
from .conftest import noop_app


async def test_a_user_without_the_prefixs_channels_is_refused_at_connect(
    own_redis: RedisServer, own_admin: Redis
) -> None:
    # Redis 7 gives a new user no channels (acl-pubsub-default resetchannels).
    own_admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~{acl}:*", "+@all")
    url = f"redis://app:pw@127.0.0.1:{own_redis.port}/0?prefix=acl"
    backend = backend_from_url(url)
    with pytest.raises(BackendError, match=r"may not publish to the channel .*&\{acl\}:\*"):
        await backend.connect()
    assert own_admin.keys("{acl}:*") == []  # nothing written
    own_admin.execute_command("ACL", "SETUSER", "app", "&{acl}:*")
    bb = noop_app(url)
    try:
        job = await bb.enqueue("noop")  # stored, and answered as stored
        assert (await bb.get(job.task_id)).task_id == job.task_id
    finally:
        await bb.close()
