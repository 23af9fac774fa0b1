"""Tokenizers of model directories: the byte tokenizer of the demo format, BPE trained by
`gyre model init`, special tokens, and incremental decoding that never splits a character."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.model.families import FAMILIES
from gyre.model.init import init_model_dir
from gyre.model.tokenizer import IncrementalDecoder, Tokenizer
from tests.support.models import hf_dir, small_dir

byte = Tokenizer.from_dir(small_dir())
bpe = Tokenizer.from_dir(hf_dir("qwen3"))


@given(st.text())
def test_round_trip(text: str) -> None:
    assert byte.decode(byte.encode(text)) == text
    assert bpe.decode(bpe.encode(text)) == text


def test_byte_ids_are_the_utf8_bytes_and_specials_follow() -> None:
    assert byte.encode("hé\n") == list("hé\n".encode())
    assert byte.vocab_size == 256 + len(FAMILIES["chatml"].special_tokens)
    assert [byte.special_id(t) for t in FAMILIES["chatml"].special_tokens] == list(range(256, 264))
    assert byte.encode("<|im_start|>user") == [257, *b"user"]  # specials in text are their ids (as in HF)


def test_bpe_vocabulary_and_special_tokens() -> None:
    assert 8_000 <= bpe.vocab_size <= 32_768
    assert len(bpe.encode("def forward(self, x):")) < len("def forward(self, x):") / 2
    assert bpe.is_special(bpe.special_id("<|im_end|>")) and not bpe.is_special(bpe.special_id("<think>"))
    assert bpe.eos_id == bpe.special_id("<|im_end|>")


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1), st.integers(min_value=1, max_value=7))
def test_incremental_decoding_never_splits_characters(text: str, chunk: int) -> None:
    for tok in (byte, bpe):
        ids = tok.encode(text)
        decoder = IncrementalDecoder(tok)
        out = "".join(decoder.feed(ids[i : i + chunk]) for i in range(0, len(ids), chunk)) + decoder.flush()
        assert out == text


def test_skip_special_tokens() -> None:
    ids = [
        *byte.encode("a"),
        byte.special_id("<tool_call>"),
        *byte.encode("é"),
        byte.special_id("<|endoftext|>"),
    ]
    assert byte.decode(ids) == "a<tool_call>é<|endoftext|>"
    assert byte.decode(ids, skip_special_tokens=True) == "aé"


def test_bpe_training_is_deterministic(tmp_path: Path) -> None:
    a = init_model_dir(tmp_path / "a", arch="qwen2", size="tiny", seed=0)
    b = init_model_dir(tmp_path / "b", arch="qwen2", size="tiny", seed=1)
    digest = [hashlib.sha256((p / "tokenizer.json").read_bytes()).hexdigest() for p in (a, b)]
    assert digest[0] == digest[1]
