"""Moving weights between cells: the core's snapshot record and the transports satellites pull with.

snapshot.py     SnapshotRecord (version, size, digest, endpoint); the digest is `gyre.trainer.flat.weights_digest`
transports/     registry of weight transports: `mooncake` (Mooncake Transfer Engine: the core
                registers its flat parameter buffer, satellites read it; TCP here, RDMA on
                clusters) and `torch` (a torch.distributed broadcast from the core, the fallback)
"""
