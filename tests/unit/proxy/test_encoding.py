"""SegmentEncoder: large texts are encoded on its threads (the tokenizer releases the GIL), short ones
on the caller's loop, and the ids are the template's either way."""

from __future__ import annotations

import asyncio
import threading

from gyre.trajectory import template_for_family
from services.proxy.encoding import SegmentEncoder


class _RecordingTemplate:
    """The chat template's `encode`, noting the thread each call ran on (the family template is shared
    by the process: it is wrapped, not patched)."""

    def __init__(self) -> None:
        self.template = template_for_family("chatml")
        self.threads: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.threads.append(threading.get_ident())
        return self.template.encode(text)


def test_large_texts_leave_the_loop_short_ones_stay() -> None:
    template = _RecordingTemplate()
    threads = template.threads
    encoder = SegmentEncoder(template, threads=2, inline_chars=100)  # type: ignore[arg-type]
    loop_thread = threading.get_ident()
    texts = ["<|im_start|>user\n" + "x = 1\n" * 40 + "<|im_end|>\n", "tail"]
    try:
        ids = asyncio.run(encoder.encode(texts))
        assert ids == [template.template.encode(t) for t in texts]
        assert len(threads) == 2 and loop_thread not in threads
        threads.clear()
        assert asyncio.run(encoder.encode(["short"])) == [template.template.encode("short")]
        assert threads == [loop_thread]
    finally:
        encoder.close()


def test_no_threads_encodes_everything_on_the_loop() -> None:
    template = _RecordingTemplate()
    encoder = SegmentEncoder(template, threads=0, inline_chars=0)  # type: ignore[arg-type]
    asyncio.run(encoder.encode(["a" * 10_000, "b"]))
    assert template.threads == [threading.get_ident()] * 2
