"""Harbor tasks in their own images through the runner and the evaluator, with real NATS, Redis and
containers from the local engine: examples/tasks/fix-sum, whose Dockerfile's RUN step installs the
checker its tests/test.sh runs, is scored right in a fresh container of its image and scores 0 everywhere
under the `process` launcher (the RUN step matters); a hostile harness that rewrites that checker, plants
tests and a reward file earns 0 (1.0 under the same_container opt-in); a build that fails and an image that exists nowhere exclude
their task's executions with one line naming the task and the step; a process over the task's
memory_mb is killed and its execution accounted; a harness stopped at its timeout is scored on what its
container holds; the demo harness runs in an image that has python3. Every container is gone once its
execution is."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.bus import EventBus
from gyre.paths import REPO_ROOT
from gyre.sandbox.containers.engine import userns_auto_unsafe
from gyre.store import Keys
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from services.evaluator.service import EvaluatorService
from services.runner.service import RunnerService
from services.scheduler.dispatch import Dispatcher, QuerySource
from tests.support.containers import PYTHON_IMAGE, containers_of, engine_client
from tests.support.proxy_stub import ProxyStub
from tests.support.runner_env import EventLog, run_config
from tests.support.scripted_anthropic import ScriptedAnthropic, arithmetic_solver

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("container_session")]

EXAMPLE = REPO_ROOT / "examples" / "tasks" / "fix-sum"
#: A stand-in agent: member 0 fixes sum.sh; every member records where it ran, what check-sum said,
#: whether it can see the verifier's tests (it must not: they are copied in after it ends) and its uid map.
HARNESS = [
    "bash",
    "-c",
    "case {execution_id} in *-e00) sed -i 's/\\$1 - \\$2/$1 + $2/' sum.sh;; esac; pwd > where.txt; "
    "check-sum sum.sh > check.txt 2>&1; ls /tests > tests.txt 2>&1; cat /proc/self/uid_map > uids.txt; true",
]


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyStub]:
    async with ProxyStub("http://127.0.0.1:9") as stub:  # the command harness calls no model
        yield stub


def _config(
    run_id: str,
    tmp_path: Path,
    nats: ServerProcess,
    redis: ServerProcess,
    proxy: ProxyStub,
    isolation: str,
    harness: list[str] = HARNESS,
) -> Any:
    box = {"kill_grace_s": 1.0, "isolation": isolation}
    return run_config(
        run_id,
        tmp_path / "runs",
        nats.url,
        redis.url,
        proxy.port,
        tasks={"dirs": [str(tmp_path / "tasks")]},
        runner={
            "harness": "command",
            "command": harness,
            "max_concurrent": 4,
            "sandbox": {**box, "uid_base": 196000},
        },
        evaluator={"backoff_s": 0.2, "max_concurrent": 2, "sandbox": {**box, "uid_base": 197000}},
    )


async def _run_group(
    config: Any, redis: aioredis.Redis, keys: Keys, bus: EventBus, task: str, size: int = 2
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    queries = QuerySource(TaskSet.from_section(config.tasks), seed=0)
    dispatcher = Dispatcher(redis, keys, bus, "generic", queries, group_size=size)
    events = await EventLog.attach(bus)
    async with RunnerService(config), EvaluatorService(config):
        await dispatcher.dispatch(num_groups=1, group_size=size, policy_version=0, burst=0)
        await dispatcher.start("cell-0", size)
        (ready,) = await events.wait_for(ev.GroupReady, timeout_s=120)
    terms = {e.execution.execution_id[-3:]: e for e in events.of(ev.ExecutionTerminated)}
    done = {e.execution.execution_id[-3:]: e for e in events.of(ev.EvaluationDone)}
    return terms, done, ready


@pytest.mark.parametrize("isolation", ["container", "process"])
async def test_the_image_run_steps_decide_the_reward(
    isolation: str,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    client = engine_client()
    shutil.copytree(EXAMPLE, tmp_path / "tasks" / "fix-sum")
    config = _config(run_id, tmp_path, nats_server, redis_server, proxy, isolation)
    terms, done, ready = await _run_group(config, redis, keys, bus, "tasks/fix-sum")
    assert {t.reason for t in terms.values()} == {cm.TERMINATION_REASON_COMPLETED}
    assert {k: d.status for k, d in done.items()} == {
        "e00": cm.EVALUATION_STATUS_VALID,
        "e01": cm.EVALUATION_STATUS_VALID,
    }
    workspace = {k: Path(t.workspace.path) for k, t in terms.items()}
    if isolation == "container":
        # The fix earns 1, the untouched script 0: test.sh ran check-sum, which only the image has.
        assert {k: d.reward for k, d in done.items()} == {"e00": 1.0, "e01": 0.0}
        assert all("in a fresh container of the task's image" in d.detail for d in done.values()), done
        assert (workspace["e00"] / "where.txt").read_text().strip() == "/app"
        assert "all 4 checks passed" in (workspace["e00"] / "check.txt").read_text()
        assert "printed -1, not 5" in (workspace["e01"] / "check.txt").read_text()
        assert "No such file or directory" in (workspace["e00"] / "tests.txt").read_text()
        # sandbox.container.userns: auto: a user namespace of its own (container root is not host root)
        # where the engine creates one safely, else the host's (podman 4.3.1: containers/podman#16062)
        inside, host, size = map(int, (workspace["e00"] / "uids.txt").read_text().split())
        if userns_auto_unsafe(client) is None:
            assert inside == 0 and host >= 65536 and size >= 65534, (inside, host, size)
        else:
            assert (inside, host, size) == (0, 0, 4294967295)
        assert terms["e00"].workspace.content_hash != terms["e01"].workspace.content_hash
    else:
        # On the host there is no check-sum: the same fix scores 0, like no fix at all.
        assert {k: d.reward for k, d in done.items()} == {"e00": 0.0, "e01": 0.0}
        assert "command not found" in (workspace["e00"] / "check.txt").read_text()
    assert ready.num_valid == 2
    assert containers_of(client, **{"gyre.run": run_id}) == []


#: A hostile agent (member 0) that never solves the task: it rewrites the grader its image's RUN step made,
#: makes its own sum.sh end whatever sources it with success, plants a /tests/test.sh and a reward file,
#: and preloads a library into every later process. Member 1 fixes sum.sh honestly.
HOSTILE = [
    "bash",
    "-c",
    "case {execution_id} in "
    "*-e00) printf '#!/bin/bash\\necho all 4 checks passed\\nexit 0\\n' > /usr/local/bin/check-sum; "
    "printf 'echo all 4 checks passed; exit 0\\n' > sum.sh; "
    "mkdir -p /tests /logs/verifier; printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; "
    "echo 1 > /logs/verifier/reward.txt; echo /nonexistent/hook.so > /etc/ld.so.preload;; "
    "*) sed -i 's/\\$1 - \\$2/$1 + $2/' sum.sh;; esac; true",
]


@pytest.mark.parametrize("same_container", [False, True])
async def test_a_harness_that_rewrites_its_grader_earns_nothing(
    same_container: bool,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    """The verifier runs in a fresh container of the built image: the hostile member scores its real work
    (0), the honest one 1. With Harbor's same-container order (the opt-in, allowed for this run) the same
    attack is scored 1.0: the defence is what this test sees."""
    task = tmp_path / "tasks" / "fix-sum"
    shutil.copytree(EXAMPLE, task)
    if same_container:
        toml = (task / "task.toml").read_text()
        (task / "task.toml").write_text(toml.replace("[verifier]\n", "[verifier]\nsame_container = true\n"))
    config = _config(run_id, tmp_path, nats_server, redis_server, proxy, "container", harness=HOSTILE)
    config.tasks.allow_same_container_verifier = same_container
    terms, done, ready = await _run_group(config, redis, keys, bus, "tasks/fix-sum")
    assert {t.reason for t in terms.values()} == {cm.TERMINATION_REASON_COMPLETED}
    assert {k: d.status for k, d in done.items()} == {
        "e00": cm.EVALUATION_STATUS_VALID,
        "e01": cm.EVALUATION_STATUS_VALID,
    }, done
    assert ready.num_valid == 2
    if same_container:
        assert {k: d.reward for k, d in done.items()} == {"e00": 1.0, "e01": 1.0}
        assert all("the execution's container (same_container)" in d.detail for d in done.values())
    else:
        assert {k: d.reward for k, d in done.items()} == {"e00": 0.0, "e01": 1.0}
        assert all("a fresh container of the task's image" in d.detail for d in done.values())
    assert containers_of(engine_client(), **{"gyre.run": run_id}) == []


def _harbor_task(root: Path, name: str, dockerfile: str, **environment: Any) -> None:
    """A copy of fix-sum named `name` with its own Dockerfile and [environment] keys."""
    task = root / name
    shutil.copytree(EXAMPLE, task)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    toml = (task / "task.toml").read_text()
    for key, value in environment.items():
        toml = toml.replace(f"\n{key} = ", f"\n# {key} = ") + f"{key} = {value}\n"
    (task / "task.toml").write_text(toml)


async def test_a_failing_build_and_a_missing_base_exclude_their_executions_with_the_step(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    engine_client()
    tasks = tmp_path / "tasks"
    base = "FROM localhost/gyre/debian-base:bookworm\n"
    _harbor_task(tasks, "broken-run", f"{base}RUN echo {run_id} && exit 3\nWORKDIR /app\nCOPY sum.sh /app/\n")
    _harbor_task(tasks, "no-base", f"FROM nowhere.invalid/gyre/{run_id}:1\nWORKDIR /app\n")
    config = _config(run_id, tmp_path, nats_server, redis_server, proxy, "container")
    queries = QuerySource(TaskSet.from_section(config.tasks), seed=0)
    dispatcher = Dispatcher(redis, keys, bus, "generic", queries, group_size=2)
    events = await EventLog.attach(bus)
    async with RunnerService(config), EvaluatorService(config):
        await dispatcher.dispatch(num_groups=2, group_size=2, policy_version=0, burst=0)
        await dispatcher.start("cell-0", 4)
        ready = await events.wait_for(ev.GroupReady, 2, timeout_s=120)
    starts = {e.execution.execution_id: e.task_id for e in events.of(ev.ExecutionStartRequested)}
    terms = events.of(ev.ExecutionTerminated)
    assert {t.reason for t in terms} == {cm.TERMINATION_REASON_ENVIRONMENT_UNAVAILABLE}
    for t in terms:
        task_id = starts[t.execution.execution_id]
        assert "\n" not in t.detail and f"task {task_id}: image build failed at " in t.detail, t.detail
        if task_id == "tasks/broken-run":
            assert re.search(rf"at STEP 2/\d+: RUN echo {run_id} && exit 3: .*exit status 3", t.detail)
        else:
            assert re.search(
                rf"at STEP 1/\d+: FROM nowhere.invalid/gyre/{run_id}:1: .*no such host", t.detail
            )
    done = events.of(ev.EvaluationDone)
    assert len(done) == 4 and {d.status for d in done} == {cm.EVALUATION_STATUS_EXCLUDED}
    assert {d.detail for d in done} == {t.detail for t in terms}
    assert sorted((r.num_excluded, r.num_valid) for r in ready) == [(2, 0), (2, 0)]
    # Each task was built once (its failure remembered), its log in the run directory.
    logs = sorted(p.name.split("-")[0] for p in (config.run.path / "builds").iterdir())
    assert logs == ["tasks_broken", "tasks_no"], logs


async def test_a_process_over_the_tasks_memory_is_killed_and_its_execution_accounted(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    client = engine_client()
    _harbor_task(
        tmp_path / "tasks", "fix-sum", (EXAMPLE / "environment" / "Dockerfile").read_text(), memory_mb=64
    )
    hog = ["bash", "-c", "echo started > started.txt; a=x; while :; do a=$a$a; done"]
    config = _config(run_id, tmp_path, nats_server, redis_server, proxy, "container", hog)
    terms, done, ready = await _run_group(config, redis, keys, bus, "tasks/fix-sum", size=1)
    (term,), (evaluation,) = terms.values(), done.values()
    assert term.reason == cm.TERMINATION_REASON_FAILED and term.exit_code == -9
    assert term.detail.startswith("killed by SIGKILL (memory limit)"), term.detail
    # Accounted like any harness that died: its preserved workspace is scored by test.sh (no fix: 0).
    assert (Path(term.workspace.path) / "started.txt").is_file()
    assert (evaluation.status, evaluation.reward) == (cm.EVALUATION_STATUS_VALID, 0.0)
    assert ready.num_valid == 1
    assert containers_of(client, **{"gyre.run": run_id}) == []


async def test_a_harness_timeout_is_scored_on_what_the_container_holds(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    engine_client()
    dockerfile = (EXAMPLE / "environment" / "Dockerfile").read_text()
    _harbor_task(tmp_path / "tasks", "fix-sum", dockerfile)
    toml = tmp_path / "tasks" / "fix-sum" / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\ntimeout_sec = 120.0", "[agent]\ntimeout_sec = 4.0"))
    fixes_then_hangs = ["bash", "-c", "sed -i 's/\\$1 - \\$2/$1 + $2/' sum.sh; trap '' TERM; sleep 600"]
    config = _config(run_id, tmp_path, nats_server, redis_server, proxy, "container", fixes_then_hangs)
    terms, done, _ = await _run_group(config, redis, keys, bus, "tasks/fix-sum", size=1)
    (term,), (evaluation,) = terms.values(), done.values()
    assert term.reason == cm.TERMINATION_REASON_HARNESS_TIMEOUT and "killed by SIGKILL" in term.detail
    # The partial work (the fix, made before the timeout) is what test.sh scores, copied into a fresh one.
    assert (evaluation.status, evaluation.reward) == (cm.EVALUATION_STATUS_VALID, 1.0)
    assert "in a fresh container of the task's image" in evaluation.detail


async def test_the_demo_harness_runs_in_an_image_with_python(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
) -> None:
    client = engine_client(PYTHON_IMAGE)
    box = {"kill_grace_s": 1.0, "isolation": "container", "container": {"default_image": PYTHON_IMAGE}}
    with ScriptedAnthropic(arithmetic_solver) as api:
        async with ProxyStub(api.base_url) as stub:
            config = run_config(
                run_id,
                tmp_path / "runs",
                nats_server.url,
                redis_server.url,
                stub.port,
                tasks={"queries": ["add"]},
                runner={"harness": "demo", "max_concurrent": 2, "sandbox": box},
                # The built-in task's verifier (score_line: Gyre's own code) runs on the host.
                evaluator={"sandbox": {**box, "uid_base": 198000}},
            )
            terms, done, ready = await _run_group(config, redis, keys, bus, "add", size=2)
    assert {t.reason for t in terms.values()} == {cm.TERMINATION_REASON_COMPLETED}, terms
    assert {(d.status, d.reward) for d in done.values()} == {(cm.EVALUATION_STATUS_VALID, 1.0)}, done
    # Each member's calls came from inside its container, through the relay, under its own key.
    assert {r.api_key for r in api.requests} == {
        ProxyStub.key_for(e.execution.execution_id) for e in terms.values()
    }
    assert ready.mean_reward == 1.0
    assert containers_of(client, **{"gyre.run": run_id}) == []


async def test_no_engine_answering_excludes_the_executions_naming_the_endpoint(
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    run_id: str,
    tmp_path: Path,
    bus: EventBus,
    redis: aioredis.Redis,
    keys: Keys,
    proxy: ProxyStub,
) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "tasks" / "fix-sum")
    config = _config(run_id, tmp_path, nats_server, redis_server, proxy, "container")
    endpoint = f"unix://{tmp_path}/gone.sock"
    for section in (config.runner, config.evaluator):
        section.sandbox.container.endpoint = endpoint
    terms, done, ready = await _run_group(config, redis, keys, bus, "tasks/fix-sum")
    line = f"environment unavailable: no container engine answers at {endpoint}: no such socket"
    assert {(t.reason, t.detail) for t in terms.values()} == {
        (cm.TERMINATION_REASON_ENVIRONMENT_UNAVAILABLE, line)
    }
    assert {(d.status, d.detail) for d in done.values()} == {(cm.EVALUATION_STATUS_EXCLUDED, line)}
    assert (ready.num_excluded, ready.num_valid) == (2, 0)
