"""`gyre events tail [--run R] [--subject S] [--history]`: print decoded events as they arrive.

Live events come from a plain NATS subscription on `gyre.<run>.>` (every area, commands too);
`--history` first replays what the run's event stream holds. One JSON line per event:
{"subject": …, "type": …, "event": {…}}.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import typer
from google.protobuf import json_format

from app.cli._config import config_or_exit
from gyre.config import load_config

events_app = typer.Typer(help="Inspect the run's events.", no_args_is_help=True)


def _line(subject: str, headers: dict[str, str] | None, data: bytes) -> str:
    from gyre.bus.codec import TYPE_HEADER, decode_event

    type_name = (headers or {}).get(TYPE_HEADER, "")
    try:
        event = json_format.MessageToDict(decode_event(type_name, data))
    except ValueError:
        event = {"raw": data.decode(errors="replace")}
    return json.dumps({"subject": subject, "type": type_name, "event": event})


async def _tail(url: str, run_id: str, subject: str, history: bool, count: int, auth: dict[str, str]) -> None:
    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy

    from gyre.bus.subjects import event_stream

    nc = await nats.connect(url, **auth)  # type: ignore[arg-type]
    printed = 0
    done = asyncio.Event()
    try:
        if history:
            js = nc.jetstream()
            sub = await js.subscribe(
                subject,
                stream=event_stream(run_id).name,
                ordered_consumer=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
            )
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except nats.errors.TimeoutError:
                    break
                typer.echo(_line(msg.subject, msg.headers, msg.data))
                printed += 1
                if count and printed >= count:
                    return
            await sub.unsubscribe()

        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            nonlocal printed
            typer.echo(_line(msg.subject, msg.headers, msg.data))
            printed += 1
            if count and printed >= count:
                done.set()

        await nc.subscribe(subject, cb=on_msg)
        await done.wait()
    finally:
        await nc.close()


@events_app.command("tail")
def tail(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config (the run's resolved config)."
    ),
    run: str | None = typer.Option(None, "--run", help="Run id (default: the config's)."),
    subject: str | None = typer.Option(None, "--subject", help="Subject filter (default gyre.<run>.>)."),
    history: bool = typer.Option(False, "--history", help="Replay the stored events first."),
    count: int = typer.Option(0, "--count", help="Exit after this many events (0 = never)."),
) -> None:
    """Print decoded events of a run, live."""
    cfg = config_or_exit(config)
    run_id = run or cfg.run.id
    nats_section = cfg.nats
    if nats_section.url is None:
        resolved = cfg.run.path / "config.yaml"
        if resolved.exists():
            nats_section = load_config(resolved).nats
    url = nats_section.url
    if url is None:
        typer.echo(
            f"error: no NATS url: run `gyre up` first or pass --config runs/{run_id}/config.yaml", err=True
        )
        raise typer.Exit(2)
    from gyre.bus import nats_auth

    try:
        auth = nats_auth(nats_section.login_for("cli"))  # the run's read-only user, when it has credentials
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_tail(url, run_id, subject or f"gyre.{run_id}.>", history, count, auth))


def register(app: typer.Typer) -> None:
    app.add_typer(events_app, name="events")
