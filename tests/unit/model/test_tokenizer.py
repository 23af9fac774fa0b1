"""The byte tokenizer: round trips, special tokens, incremental decoding of split UTF-8."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gyre.model.tokenizer import NUM_BYTES, SPECIAL_TOKENS, ByteTokenizer, IncrementalDecoder

tok = ByteTokenizer()


@given(st.text())
def test_round_trip(text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_special_strings_in_text_stay_bytes() -> None:
    ids = tok.encode("<|im_end|>")
    assert all(i < NUM_BYTES for i in ids)
    assert tok.decode([tok.special_id("<|im_end|>")]) == "<|im_end|>"
    assert tok.vocab_size == NUM_BYTES + len(SPECIAL_TOKENS)


@given(st.text(min_size=1), st.integers(min_value=1, max_value=7))
def test_incremental_decoding_never_splits_characters(text: str, chunk: int) -> None:
    ids = tok.encode(text)
    decoder = IncrementalDecoder(tok)
    out = "".join(decoder.feed(ids[i : i + chunk]) for i in range(0, len(ids), chunk)) + decoder.flush()
    assert out == text


def test_skip_special_tokens() -> None:
    ids = [*tok.encode("a"), tok.special_id("<tool_call>"), *tok.encode("é"), tok.eos_id]
    assert tok.decode(ids) == "a<tool_call>é<|endoftext|>"
    assert tok.decode(ids, skip_special_tokens=True) == "aé"
