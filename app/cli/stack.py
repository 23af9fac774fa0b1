"""`gyre up`, `gyre down`, `gyre status`: the local stack on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from app.cli._config import config_or_exit
from gyre.config import GyreConfig, load_config
from gyre.roles import role_name
from gyre.rpc import sync_channel

_RUN_OPTION = typer.Option(
    None,
    "--run",
    help="Run id under run.dir; default: the configured run, else the only live one (e.g. a demo).",
)


def _run_dir(cfg: GyreConfig, run: str | None) -> Path:
    """The run folder a stack command acts on; exits 1 naming the live runs when that is ambiguous."""
    from app.stack.launcher import live_runs, resolve_run

    run_dir = resolve_run(cfg.run.dir, cfg.run.id, run)
    if run_dir is not None:
        return run_dir
    live = live_runs(cfg.run.dir)
    if live:
        typer.echo(f"several runs are live; pick one with --run: {', '.join(d.name for d in live)}", err=True)
    else:
        typer.echo(f"nothing running under {cfg.run.dir}/")
    raise typer.Exit(1)


def up_cmd(
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return once every service is SERVING."),
    wait_s: float = typer.Option(30.0, "--wait", help="Seconds to wait for SERVING."),
) -> None:
    """Start nats-server, redis-server and every service; all bind 127.0.0.1. Without `model.path` in
    the config, the embedded default's model (the packaged warm start, as `gyre demo` trains)."""
    from app.demo.config import embedded_model_path
    from app.stack.launcher import StackError, up
    from app.stack.signals import StopSignals
    from gyre.config import ConfigError
    from gyre.model.arch import ModelError

    # The embedded default's model unless the file (or GYRE_MODEL__PATH) names one, as for `gyre demo`.
    cfg = config_or_exit(
        config, lambda: load_config(config, base={"model": {"path": str(embedded_model_path())}})
    )
    with StopSignals() as stop:
        try:
            state = up(cfg, wait_s=wait_s, attached=not detach, stop=stop.event)
        except (ModelError, ConfigError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        except StackError as e:
            if stop.event.is_set():  # Ctrl-C while the start finished: a stop, not a failure
                typer.echo("stack stopped")
                raise typer.Exit(stop.exit_code) from None
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"run {state.run_id} up: {len(state.processes)} processes; config {state.config_path}")
        if detach:
            return
        _hold_attached(state, stop)
    typer.echo("stack stopped")
    raise typer.Exit(stop.exit_code)


def _hold_attached(state: Any, stop: Any) -> None:
    """Until Ctrl-C (or SIGTERM) stops the stack, or the stack stops by itself (exit 1, its error said)."""
    from app.stack.launcher import StackState, down_state

    typer.echo(f"Ctrl-C stops the stack (within {state.stop_bound_s:.0f} s).")
    stop.on_stop = lambda: down_state(state)
    if stop.event.is_set() and not stop.teardown_started:  # a signal came while the start finished
        down_state(state)
    while not stop.event.wait(0.5):
        if not state.supervisor_alive():
            if stop.event.is_set():  # a signal's teardown stopped it between two waits
                break
            final = StackState.load(Path(state.run_dir))
            typer.echo(f"error: {final.error if final and final.error else 'the stack stopped'}", err=True)
            down_state(state)
            raise typer.Exit(1)


def down_cmd(
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file."),
    run: str | None = _RUN_OPTION,
) -> None:
    """Stop every process of the run (services, then Redis and NATS)."""
    from app.stack.launcher import down

    run_dir = _run_dir(config_or_exit(config), run)
    typer.echo(
        f"stopped run {run_dir.name!r}" if down(run_dir) else f"nothing running for run {run_dir.name!r}"
    )


def status_cmd(
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    run: str | None = _RUN_OPTION,
) -> None:
    """Each process of the run: pid, health (grpc.health.v1) and ports; the scheduler's state."""
    from app.stack.launcher import status

    run_dir = _run_dir(config_or_exit(config), run)
    rows = status(run_dir)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo(f"nothing running for run {run_dir.name!r}")
        raise typer.Exit(1)
    for line in _status_lines(run_dir.name, rows):
        typer.echo(line)


def _status_lines(run: str, rows: list[dict[str, Any]]) -> list[str]:
    """`gyre status` without --json: a line per process, then the scheduler's and the proxy's state."""
    lines = [f"run {run}"]
    for r in rows:
        ports = (
            f"grpc {r['grpc_port']}"
            if r["grpc_port"]
            else " ".join(f"{k} {v}" for k, v in r.get("ports", {}).items())
        )
        if r.get("metrics_port"):
            ports += f"  metrics {r['metrics_port']}"
        restarts = f"  restarts {r['restarts']} (last: {r['last_exit']})" if r.get("restarts") else ""
        lines.append(f"{r['name']:<14} pid {r['pid']:<8} {r['health']:<12} {ports}{restarts}")
        if r.get("error"):
            lines.append(f"  error: {r['error']}")
    scheduler = next((r for r in rows if r["name"] == "scheduler" and r["health"] == "SERVING"), None)
    if scheduler is not None:
        lines.append(_run_state(int(scheduler["grpc_port"])))
    proxy = next((r for r in rows if r["name"] == "proxy" and r["health"] == "SERVING"), None)
    if proxy is not None:
        lines.append(_proxy_state(int(proxy["grpc_port"])))
    return lines


def register(app: typer.Typer) -> None:
    app.command("up")(up_cmd)
    app.command("down")(down_cmd)
    app.command("status")(status_cmd)


def _proxy_state(port: int) -> str:
    """The proxy's counters: calls recorded, side calls, the history-mismatch rate (retokenization
    drift or a harness rewriting its history shows here instead of silently growing the trees), and the
    calls it refused, by reason, with the latest message of each."""
    import grpc

    from app.stack.servers import LOOPBACK
    from gyre.v1 import proxy_pb2, proxy_pb2_grpc

    with sync_channel(f"{LOOPBACK}:{port}") as channel:
        try:
            st = proxy_pb2_grpc.ProxyStub(channel).GetStats(proxy_pb2.GetStatsRequest(), timeout=5)
        except grpc.RpcError as e:
            return f"proxy stats unavailable: {e.code().name}"
    rate = st.history_mismatches / st.recorded_calls if st.recorded_calls else 0.0
    refused = sum(st.refused_calls.values())
    lines = [
        f"proxy     requests {st.requests}  recorded calls {st.recorded_calls}  side calls {st.side_calls}"
        f"  history mismatches {st.history_mismatches} ({rate:.1%})  reroutes {st.reroutes}"
        f"  open executions {st.open_executions}  refused calls {refused}"
    ]
    for reason, n in sorted(st.refused_calls.items(), key=lambda kv: -kv[1]):
        lines.append(f"  refused {reason}: {n} (latest: {st.refusal_messages.get(reason, '')[:160]})")
    t = st.chat_template
    if t.source == "registry":
        lines.append(
            f"  chat template {t.name}: the verified {t.family} template, in place of the model's own {t.replaced}"
            " (not append-only; `gyre model verify-template` shows the difference)"
        )
    elif t.name:
        lines.append(f"  chat template {t.name}: the model's own")
    return "\n".join(lines)


def _run_state(port: int) -> str:
    """The scheduler's view: roles, waterlevel, ledger, counters, version, staleness."""
    import grpc

    from app.stack.servers import LOOPBACK
    from gyre.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

    with sync_channel(f"{LOOPBACK}:{port}") as channel:
        try:
            st = scheduler_pb2_grpc.SchedulerStub(channel).GetState(
                scheduler_pb2.GetStateRequest(), timeout=5
            )
        except grpc.RpcError as e:
            return f"scheduler state unavailable: {e.code().name}"
    roles = " ".join(f"{c.cell}:{role_name(c.role)}" for c in st.cells)
    c = st.counters
    return (
        f"run {st.run_id}  mode {common_pb2.SchedulingMode.Name(st.mode).removeprefix('SCHEDULING_MODE_').lower()}"
        f"  version {st.policy_version} (published {st.published_version})  burst {st.burst}\n"
        f"cells     {roles}\n"
        f"counters  dispatched {c.dispatched}  started {c.started}  finished {c.finished}"
        f"  (queued {c.dispatched - c.started}, running {c.started - c.finished})\n"
        f"waterlevel {st.waterlevel}  rollout capacity C_R {st.rollout_capacity}  training cells {st.training_cells}"
        f"  ready groups {st.ready_groups}  mean staleness {st.mean_staleness:.2f}\n"
        f"packed    executions {st.packed_executions}  without a target token {st.executions_without_targets}"
        f"{_share(st.executions_without_targets, st.packed_executions)}"
    )


def _share(part: int, whole: int) -> str:
    return f" ({part / whole:.0%})" if whole else ""
