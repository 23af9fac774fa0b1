"""The embedded default's servers refuse clients without the run's credentials (real nats-server and
redis-server, started as `gyre up` starts them), and each user reaches only what its service needs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
import redis
import redis.asyncio as aioredis

from app.stack.credentials import RunCredentials, generate
from app.stack.servers import ServerProcess, start_nats, start_redis
from gyre.bus import EventBus
from gyre.config.infra import ClientLogin, read_login
from gyre.store import Keys, connect_redis
from gyre.v1 import events_pb2 as ev
from tests.support.eventually import eventually

RUN = "credtest"


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> RunCredentials:
    return generate(tmp_path_factory.mktemp("run"), RUN)


@pytest.fixture(scope="module")
def nats_auth(creds: RunCredentials, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_nats(tmp_path_factory.mktemp("nats"), users_file=creds.nats_users)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_auth(creds: RunCredentials, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_redis(
        tmp_path_factory.mktemp("redis"),
        appendonly=False,
        acl_file=creds.redis_acl,
        login=read_login(creds.redis_template, "supervisor"),
    )
    yield server
    server.stop()


def _login(template: str, user: str) -> ClientLogin:
    login = read_login(template, user)
    assert login is not None
    return login


async def test_nats_refuses_a_client_without_or_with_wrong_credentials(
    nats_auth: ServerProcess, creds: RunCredentials
) -> None:
    for auth in ({}, {"user": "runner", "password": "wrong"}, {"user": "nobody", "password": "x"}):
        with pytest.raises((nats.errors.Error, OSError)):
            await nats.connect(
                nats_auth.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **auth
            )  # type: ignore[arg-type]
    bus = await EventBus.connect(nats_auth.url, RUN, "runner", login=_login(creds.nats_template, "runner"))
    assert await bus.publish(ev.ExecutionStarted(), event_id="started-1")
    await bus.close()


async def test_a_nats_user_cannot_publish_another_services_events(
    nats_auth: ServerProcess, creds: RunCredentials
) -> None:
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    login = _login(creds.nats_template, "runner")
    nc = await nats.connect(
        nats_auth.url,
        user=login.user,
        password=login.password,
        error_cb=on_error,
        inbox_prefix="_INBOX_runner",
    )
    try:
        await nc.publish(f"gyre.{RUN}.train.step_completed", b"{}")
        await nc.subscribe(f"gyre.{RUN}.>")
        await nc.flush()

        def refused_both() -> bool:
            text = " ".join(str(e) for e in errors).lower()
            return (
                "permissions violation for publish" in text
                and "permissions violation for subscription" in text
            )

        await eventually(
            refused_both, timeout_s=10, what="the server to refuse the publish and the subscription"
        )
    finally:
        await nc.close()


async def test_redis_refuses_a_client_without_or_with_wrong_credentials(
    redis_auth: ServerProcess, creds: RunCredentials
) -> None:
    with pytest.raises(redis.AuthenticationError):
        await connect_redis(redis_auth.url)
    with pytest.raises(redis.AuthenticationError):
        await connect_redis(redis_auth.url, ClientLogin("scheduler", "wrong"))
    client = await connect_redis(redis_auth.url, _login(creds.redis_template, "scheduler"))
    await client.aclose()


async def test_a_redis_user_reaches_only_its_runs_keys_and_the_commands_it_needs(
    redis_auth: ServerProcess, creds: RunCredentials
) -> None:
    keys = Keys(RUN)
    client: aioredis.Redis = await connect_redis(redis_auth.url, _login(creds.redis_template, "packer"))
    try:
        await client.set(keys.counters(), b"1")
        script = client.register_script("return redis.call('INCR', KEYS[1])")
        assert await script(keys=[keys.queue("q", "n")]) == 1  # EVALSHA, after NOSCRIPT: SCRIPT LOAD
        async with client.pipeline(transaction=True) as tx:
            await tx.incr(keys.queue("q", "n")).hset(keys.group("g1"), "k", "v").execute()
        await client.time()
        for forbidden in (
            client.set("gyre:other-run:x", b"1"),
            client.flushall(),
            client.config_get("*"),
            client.keys("*"),
            client.execute_command("SHUTDOWN"),
        ):
            with pytest.raises(redis.ResponseError, match=r"NOPERM|permission"):
                await forbidden
    finally:
        await client.aclose()
    cli: aioredis.Redis = await connect_redis(redis_auth.url, _login(creds.redis_template, "cli"))
    try:
        assert await cli.get(keys.counters()) == b"1"
        assert await cli.dbsize() >= 2 and "used_memory_dataset" in await cli.info("memory")  # memory figures
        with pytest.raises(redis.ResponseError, match=r"NOPERM|permission"):
            await cli.set(keys.counters(), b"2")
    finally:
        await cli.aclose()


def test_credentials_files_live_in_the_run_directory(creds: RunCredentials) -> None:
    assert creds.directory.name == "credentials"
    assert Path(creds.nats_template.replace("{service}", "cli")).exists()
