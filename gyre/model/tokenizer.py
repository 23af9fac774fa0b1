"""Byte-level tokenizer with special tokens, the tokenizer of the embedded model.

Ids 0..255 are raw bytes; special tokens follow. Text from callers is always encoded as bytes
(a user cannot inject a special token by typing it); the chat template inserts special ids
directly. Decoding is incremental-safe through `IncrementalDecoder`, which holds back an
incomplete UTF-8 sequence until its last byte arrives.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

NUM_BYTES = 256

#: Special tokens in id order, starting at id 256. Append only: ids are baked into checkpoints.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|pad|>",
)


class ByteTokenizer:
    """Bytes are tokens; special tokens get the ids after the 256 bytes."""

    def __init__(self, special_tokens: Sequence[str] = SPECIAL_TOKENS) -> None:
        self.special_tokens = tuple(special_tokens)
        self._special_to_id = {tok: NUM_BYTES + i for i, tok in enumerate(self.special_tokens)}
        self._id_to_special = {i: tok for tok, i in self._special_to_id.items()}

    @property
    def vocab_size(self) -> int:
        return NUM_BYTES + len(self.special_tokens)

    @property
    def eos_id(self) -> int:
        return self._special_to_id["<|endoftext|>"]

    @property
    def pad_id(self) -> int:
        return self._special_to_id["<|pad|>"]

    def special_id(self, token: str) -> int:
        """The id of a special token; `KeyError` names the token if it is unknown."""
        return self._special_to_id[token]

    def is_special(self, token_id: int) -> bool:
        return token_id >= NUM_BYTES

    def encode(self, text: str) -> list[int]:
        """Encode text as UTF-8 bytes. Special-token strings in `text` stay plain bytes."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Decode ids; invalid UTF-8 becomes U+FFFD; special tokens render as their strings."""
        decoder = IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)
        return decoder.feed(ids) + decoder.flush()

    def token_text(self, token_id: int) -> str:
        """The text of a single token as SGLang reports it in log-prob triples."""
        if token_id in self._id_to_special:
            return self._id_to_special[token_id]
        if 0 <= token_id < NUM_BYTES:
            return bytes([token_id]).decode("utf-8", errors="replace")
        raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")


class IncrementalDecoder:
    """Turns a stream of ids into text without splitting multi-byte UTF-8 characters."""

    def __init__(self, tokenizer: ByteTokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        parts: list[str] = []
        pending = bytearray()
        for token_id in ids:
            if 0 <= token_id < NUM_BYTES:
                pending.append(token_id)
                continue
            if pending:
                parts.append(self._utf8.decode(bytes(pending)))
                pending.clear()
            parts.append(self._utf8.decode(b"", final=True))
            if not self._skip_special:
                parts.append(self._tokenizer.token_text(token_id))
        if pending:
            parts.append(self._utf8.decode(bytes(pending)))
        return "".join(parts)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
