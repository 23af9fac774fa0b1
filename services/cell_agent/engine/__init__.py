"""The embedded rollout engine: the HF model (or a script) behind SGLang's native HTTP API.

A component the cell agent hosts in the rollout role. Start it in-process with `EngineServer`, or as
a process with `python -m services.cell_agent.engine --config gyre.yaml`. Pieces:

    protocol.py      SGLang request fields, parsed and validated
    core.py          EngineCore: continuous batching, stop rules, pause/abort, control operations
    sources/         output sources (registry): `model` (CausalLM + paged KV), `scripted`, `scored_script`
    blocks.py        block accounting and the prefix cache, keyed by (weight version, token prefix)
    kv_store.py      the model source's paged KV pool, pins, export/import
    kv_transfer.py   the KV migration payload (safetensors over HTTP)
    sampler.py       temperature / top-k / top-p / min-p sampling with per-request generators
    output.py        SGLang-shaped responses and streaming chunks
    http_api.py      the HTTP routes;  server.py  EngineServer (lifecycle, in-process control)
"""

from services.cell_agent.engine.server import EngineServer

__all__ = ["EngineServer"]
