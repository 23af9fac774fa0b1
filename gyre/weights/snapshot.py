"""The core's weight snapshot as satellites see it: a record naming the version, size and digest of
the flat parameter buffer and where to read it (the digest itself is `gyre.trainer.flat.weights_digest`).

The record lives in Redis (the cell agent writes it); its `seq` field is a sequence lock: the core
makes it odd before it changes the buffer (an optimizer step) and even afterwards, so a reader that
saw the same even `seq` before and after its read knows the bytes it got are the snapshot of
`version`, whole, even if the core moved on meanwhile.

    record = SnapshotRecord(version=7, nbytes=flat.nbytes, dtype="float32", digest=flat.digest(),
                            transport="mooncake", endpoint={"session": "10.0.0.1:15013", "address": "..."})
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """What a satellite needs to pull the core's weights of `version`."""

    version: int
    """Policy version of the weights in the buffer."""
    nbytes: int
    """Size of the flat parameter buffer."""
    dtype: str
    """torch dtype name of the buffer (`float32`)."""
    digest: str
    """SHA-256 of the buffer's bytes; empty when the core does not compute it."""
    transport: str
    """Name of the weight transport (`mooncake`, `torch`)."""
    endpoint: dict[str, str] = field(default_factory=dict)
    """Transport-specific address of the buffer (Mooncake: session and address)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SnapshotRecord:
        data = json.loads(text)
        return cls(**data)
