"""The cell agent service (one per cell): role, rollout engine, trainer, weights and collectives.

    agent.py          CellAgent: role switches, JoinBatch, weight publication, status
    roles.py          the rollout ⇄ draining ⇄ training state machine
    engine_hosts/     the hosted rollout engine by name (embedded in-process, or a supervised SGLang server)
    training.py       the training side: trainer backend, collectives, the core's snapshot, pulls
    step_runner.py    one cell's part in one optimizer step (claims, reduction, update)
    step_record.py    the step's join window and reduction handshake in Redis (scripts: step_scripts.py)
    trainer_state.py  policy version, snapshot record, publications, rendezvous in Redis
    world.py          the cells' torch.distributed world across cell restarts
    compute.py        the one worker thread of the trainer's torch work
    detached.py       operations that outlive the RPC that asked for them (switch, step, publication)
    publication.py    pushing published weights into other cells' engines (`trainer.publication`)
    replay.py         replaying the steps a restarted core lost
    metrics.py        `gyre_cell_agent_*` series;  errors.py  domain errors and their gRPC status
    servicer.py       gRPC;  service.py  the service shell
    engine/           the embedded engine

K cells as local processes for tests and benches: app/stack/cells.py (the app layer).

See README.md in this directory for the protocol, the security notes and the known limits.
"""
