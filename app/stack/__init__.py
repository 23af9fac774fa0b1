"""The local stack: NATS and Redis servers plus every Gyre service as processes on 127.0.0.1.

`gyre up` / `gyre down` / `gyre status` drive it (`launcher`); one supervisor process per run owns every
process (`supervisor`: restarts with backoff and a budget in `restarts`, `ProcessExited` events in
`events`, bounded stops through the library's `gyre.procs`); `credentials` generates the run's NATS
users and Redis ACL users; `state` is `runs/<run>/stack.json`; `signals` turns SIGTERM/SIGINT of a
foreground run into a stop request. Tests and benchmarks reuse `servers` for hermetic brokers.
"""
