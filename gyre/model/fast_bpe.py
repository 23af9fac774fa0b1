"""A faster encoder for byte-level BPE tokenizers: `tiktoken`'s core on the same vocabulary and merges.

    fast = FastBpe.build(backend)        # None, with the reason logged, when it cannot be exact
    ids = fast.encode(text)              # the ids `backend` gives, in ~40% of its CPU

The proxy encodes every new message of every harness call, and the `tokenizers` library spent a
quarter of the proxy's CPU doing it under `gyre bench load` (about 0.9 ms for a 1.3 KB tool result
here). tiktoken runs the same algorithm — split by the pre-tokenizer's regex, then merge byte pairs in
priority order — with less machinery around it.

It is used only where it gives the same ids as `tokenizers`, which `build` establishes in two ways:

- by structure: a BPE model over GPT-2's byte alphabet with no dropout, byte fallback or word
  affixes; pre-tokenization that is one regex (`ByteLevel` with its GPT-2 regex, or a `Split` with
  `Isolated` matches followed by a regex-free `ByteLevel`: Qwen2/3, Llama 3); no normalizer or NFC;
  added tokens matched verbatim (no strip or single-word flags); and merge priority that tiktoken can
  express — the product of the n-th merge has a larger id than that of every earlier merge (tiktoken
  merges by the rank of the merged token, `tokenizers` by the rank of the merge; trained vocabularies,
  Qwen's and Llama 3's included, number tokens in merge order);
- by result: both encoders must agree on `PROBE` (code, prose, CJK, emoji, combining marks, digit runs,
  contractions, whitespace runs, special tokens in text).

The two algorithms can still differ on a rare word that `tokenizers` leaves split because the pair
that would join it is not one of its merges while another split of the same token is. Such a word gets
another valid tokenization of the same text, recorded as the ids the engine was sent, so what is
trained on is still exactly what was sampled from.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from typing import Any

import tiktoken
from tokenizers import Tokenizer as Backend

from gyre.log import get_logger

log = get_logger("gyre.model.fast_bpe")

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The regex of `tokenizers`' `ByteLevel` pre-tokenizer with `use_regex` (GPT-2's)."""

PROBE = (
    "def forward(self, x):\n\treturn self.proj(x) + 1_000_000  # it's y'all's; we'll see\n\n\n",
    '    if a  !=  b:\r\n        raise ValueError(f"{a!r} != {b!r}")   \n',
    "Grüße, naïve café — Ωμέγα, Привет, مرحبا, नमस्ते, 你好世界，こんにちは 🙂👍🏽 e\u0301 A\u030a\u00a0x",
    "12345678901234567890 3.14159 0x1F ٣٤٥ ①②",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n</think>\n\nok<|im_end|>",
    "trailing spaces   \n\n   \t\t  leading\u3000full-width space  ",
)


class FastBpe:
    def __init__(self, encoding: tiktoken.Encoding, nfc: bool) -> None:
        self._encode: Callable[..., list[int]] = encoding.encode
        self._nfc = nfc

    def encode(self, text: str) -> list[int]:
        if self._nfc and not text.isascii():
            text = unicodedata.normalize("NFC", text)
        return self._encode(text, allowed_special="all")

    @classmethod
    def build(cls, backend: Backend, probe: tuple[str, ...] = PROBE) -> FastBpe | None:
        """The fast encoder of `backend`, or None (logged) where it would not give the same ids."""
        spec = json.loads(backend.to_str())
        try:
            fast = cls._from_spec(spec)
        except _Unsupported as e:
            log.debug("fast_bpe_unused", reason=str(e))
            return None
        for text in probe:
            if fast.encode(text) != backend_ids(backend, text):
                log.warning("fast_bpe_unused", reason="it encodes the probe text differently", text=text)
                return None
        return fast

    @classmethod
    def _from_spec(cls, spec: dict[str, Any]) -> FastBpe:
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise _Unsupported(f"model type {model.get('type')!r}")
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise _Unsupported(f"BPE {key}={model[key]!r}")
        if model.get("byte_fallback"):
            raise _Unsupported("BPE byte_fallback")
        normalizer = spec.get("normalizer")
        if normalizer is not None and normalizer.get("type") != "NFC":
            raise _Unsupported(f"normalizer {normalizer.get('type')!r}")
        pattern = _pattern(spec.get("pre_tokenizer"))
        specials: dict[str, int] = {}
        for added in spec.get("added_tokens") or []:
            if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
                raise _Unsupported(f"added token {added.get('content')!r} has strip or single-word flags")
            specials[added["content"]] = int(added["id"])
        return cls(
            tiktoken.Encoding(
                "gyre-fast-bpe",
                pat_str=pattern,
                mergeable_ranks=_ranks(model["vocab"], model.get("merges") or []),
                special_tokens=specials,
            ),
            nfc=normalizer is not None,
        )


class _Unsupported(ValueError):
    pass


def backend_ids(backend: Backend, text: str) -> list[int]:
    """The ids `backend` gives `text` (`encode_batch_fast`: no offsets, ~15% less CPU than `encode`)."""
    return list(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids)


def _pattern(pre: dict[str, Any] | None) -> str:
    """The one regex that splits text into words, from the pre-tokenizer."""
    if pre is None:
        raise _Unsupported("no pre-tokenizer")
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            raise _Unsupported("ByteLevel with a prefix space or without its regex")
        return GPT2_PATTERN
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        raise _Unsupported(f"pre-tokenizer {pre.get('type')!r}")
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or "Regex" not in (split.get("pattern") or {})
    ):
        raise _Unsupported("a pre-tokenizer sequence other than Split(Regex, Isolated) + ByteLevel")
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True):
        raise _Unsupported("a Split not followed by a regex-free ByteLevel")
    if byte_level.get("add_prefix_space"):
        raise _Unsupported("ByteLevel with a prefix space")
    return str(split["pattern"]["Regex"])


def _ranks(vocab: dict[str, int], merges: list[Any]) -> dict[bytes, int]:
    """tiktoken's ranks: the 256 bytes and each merge's product, ranked by id (checked to follow the
    merge order, which is the priority `tokenizers` merges in)."""
    to_byte = {ch: b for b, ch in bytes_to_unicode().items()}

    def raw(token: str) -> bytes:
        try:
            return bytes(to_byte[ch] for ch in token)
        except KeyError:
            raise _Unsupported(f"token {token!r} is not in the byte-level alphabet") from None

    ranks: dict[bytes, int] = {}
    for ch, b in to_byte.items():
        if ch not in vocab:
            raise _Unsupported(f"byte {b} has no token")
        ranks[bytes([b])] = vocab[ch]
    last = -1
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        product = vocab.get(left + right)
        if product is None or product <= last:
            raise _Unsupported("merge products are not numbered in merge order")
        ranks[raw(left) + raw(right)] = last = product
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """The byte-level alphabet: every byte as one printable character (GPT-2's mapping)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}
