"""The runner service: harness executions in sandboxes, started from the JetStream work queue."""
