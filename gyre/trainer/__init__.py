"""The training role of a cell: trainer backends, the cells' process groups, checkpoints.

    backends/       registry of trainer backends (`torch`: CausalLM + AdamW on flat buffers; `megatron`)
    layout.py       whether the configured backend can train the model (checked before anything starts)
    flat.py         parameters and gradients as views of two contiguous buffers
    optimizer.py    AdamW with a constant lr, the global-norm clip of the summed gradient
    collectives.py  the K cells' torch.distributed world and its pre-built prefix and pair groups
    checkpoint.py   trainer checkpoints (model + optimizer + version) and published weight files
    synthetic.py    synthetic micro-step batches for benchmarks and tests

Nothing here talks to Redis, NATS or gRPC; the cell agent (`services/cell_agent`) drives it.
"""
