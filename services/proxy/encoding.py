"""Tokenizing a call's new segments, off the proxy's event loop when they are large.

    encoder = SegmentEncoder(template, threads=2, inline_chars=16384)
    ids = await encoder.encode(matched.texts)          # TrajectoryTree.match → MatchedCall.encoded(ids)

Encoding the new messages is the largest piece of the proxy's CPU per call (about a fifth under
`gyre bench load`), and on the event loop it holds every other call for as long as it takes: a
133 KB tool result, ~130 ms on this machine. The tokenizer runs in Rust with the GIL released, so a
few threads encode while the loop goes on serving the calls in flight. Short texts stay on the loop:
the thread hands its ids back under the GIL, which a busy loop releases only at the interpreter's
switch interval (5 ms), so the hop pays only for segments that take longer than that to encode. Matching, rendering and committing
stay on the loop: the trees are only ever touched there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from gyre.trajectory import ChatTemplate


class SegmentEncoder:
    def __init__(self, template: ChatTemplate, *, threads: int, inline_chars: int) -> None:
        self.template = template
        self.inline_chars = inline_chars
        self._pool = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gyre-encode") if threads > 0 else None
        )

    async def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each text (`ChatTemplate.encode`)."""
        if self._pool is None or sum(len(t) for t in texts) < self.inline_chars:
            return self._encode_all(texts)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._encode_all, texts)

    def _encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.template.encode(t) for t in texts]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
