"""The Redis key schema, in one place.

Layout: `gyre:<run>:<kind>:{<entity>}:<part>`. The `{…}` hash tag groups the keys one Lua script
touches into one Redis Cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    run_id: str

    def _k(self, kind: str, entity: str, part: str) -> str:
        return f"gyre:{self.run_id}:{kind}:{{{entity}}}:{part}"

    # -- scheduler counters d / p / f (one hash + per-counter dedup sets) --------------------------
    def counters(self) -> str:
        return self._k("counters", "dpf", "values")

    def counter_seen(self, field: str) -> str:
        return self._k("counters", "dpf", f"seen:{field}")

    # -- reliable work queues ------------------------------------------------------------------
    def queue(self, name: str, part: str) -> str:
        return self._k("queue", name, part)

    # -- executions, groups, evaluations, trees, batches ---------------------------------------------
    def execution(self, execution_id: str) -> str:
        return self._k("exec", execution_id, "record")

    def group(self, group_id: str) -> str:
        return self._k("group", group_id, "record")

    def group_members(self, group_id: str) -> str:
        return self._k("group", group_id, "resolved")

    def evaluations(self, execution_id: str) -> str:
        return self._k("eval", execution_id, "list")

    def tree_nodes(self, execution_id: str) -> str:
        return self._k("tree", execution_id, "nodes")

    def tree_meta(self, execution_id: str) -> str:
        return self._k("tree", execution_id, "meta")

    # -- the runner: the executions a runner owns, and which runner claimed an execution -------------
    def runner_owned(self, runner_id: str) -> str:
        return self._k("runner", runner_id, "owned")

    def execution_runner(self, execution_id: str) -> str:
        return self._k("exec", execution_id, "runner")

    def execution_keys(self, execution_id: str) -> tuple[str, ...]:
        """Every per-execution key (record, runner claim, evaluations, tree, the proxy's key index): what
        archiving deletes once the execution's group was trained (gyre/store/archive.py)."""
        return (
            self.execution(execution_id),
            self.execution_runner(execution_id),
            self.evaluations(execution_id),
            self.tree_nodes(execution_id),
            self.tree_meta(execution_id),
            self.proxy_keys_of(execution_id),
        )

    # -- the proxy: credentials (key digest → execution) and its routing table ----------------------
    def proxy_key(self, key_digest: str) -> str:
        return self._k("proxykey", key_digest, "record")

    def proxy_keys_of(self, execution_id: str) -> str:
        """Set of the key digests issued for an execution (so archiving can drop its `proxy_key`s)."""
        return self._k("exec", execution_id, "proxykeys")

    def proxy_routes(self) -> str:
        return self._k("proxy", "routes", "hash")

    def ready_groups(self) -> str:
        return self._k("groups", "ready", "zset")

    def batch(self, batch_id: str) -> str:
        return self._k("batch", batch_id, "record")

    def open_batches(self) -> str:
        """The packer's set of batch ids whose stream is not closed yet (resumed after a restart)."""
        return self._k("batch", "open", "set")

    # -- cell agents: the core's trainer state and each cell's records (added by the cell agent) ----
    def trainer(self, part: str) -> str:
        """The core's trainer state: `version`, `snapshot`, `published`, `rendezvous`, `pulls`."""
        return self._k("trainer", "core", part)

    def cell(self, cell: int, part: str) -> str:
        """A cell agent's records: `engine` (id, url, role), `transitions` (sequence)."""
        return self._k("cell", str(cell), part)

    def scheduler_state(self) -> str:
        return self._k("scheduler", "state", "hash")

    def pattern(self) -> str:
        """Glob matching every key of the run (for cleanup)."""
        return f"gyre:{self.run_id}:*"
