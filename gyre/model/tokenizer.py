"""The tokenizer of a model directory: `tokenizer.json` (the `tokenizers` library) + `tokenizer_config.json`.

Engines, the proxy, the packer and the harness tools all read a checkpoint's tokenizer through this
one class; it needs neither torch nor transformers (the Rust `tokenizers` library does the work).

    tok = Tokenizer.from_dir(Path("/models/qwen3"))
    ids = tok.encode("hello")                  # no BOS/EOS added: chat templates place them
    tok.decode(ids), tok.special_id("<|im_end|>"), tok.chat_template

Special tokens written in the text (`<|im_end|>`) encode to their ids, as Hugging Face tokenizers
do; the chat template relies on it. The chat template is read from `chat_template.jinja` (how
transformers 5 saves it) or the `chat_template` key of tokenizer_config.json.

`IncrementalDecoder` turns a stream of ids into text without splitting a multi-byte character:
it decodes a sliding window and holds back text that ends in U+FFFD until the next id arrives.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _Backend

from gyre.model.arch import ModelError
from gyre.model.fast_bpe import FastBpe, backend_ids

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
_NAMED_SPECIALS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _token_content(value: Any) -> str | None:
    """tokenizer_config's special tokens are strings or `{"content": ...}` objects."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(path, path.name, f"not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelError(path, path.name, "top level must be an object")
    return data


@dataclass(frozen=True, slots=True)
class _Specials:
    by_name: dict[str, str]
    all_special: tuple[str, ...]


class Tokenizer:
    """A checkpoint's tokenizer and its chat template (see the module docstring)."""

    def __init__(
        self, backend: _Backend, *, chat_template: str | None, named: dict[str, str], source: str = ""
    ) -> None:
        self._backend = backend
        self.chat_template = chat_template
        self.source = source
        self.named_special_tokens = dict(named)
        added = backend.get_added_tokens_decoder()
        self._special_ids = {int(i) for i, tok in added.items() if tok.special}
        self.special_tokens: tuple[str, ...] = tuple(
            tok.content for _, tok in sorted(added.items()) if tok.special
        )
        self._to_id = {tok.content: int(i) for i, tok in added.items()}

    @classmethod
    def from_dir(cls, directory: Path) -> Tokenizer:
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise ModelError(
                path, TOKENIZER_FILE, "missing: Gyre needs the fast tokenizer file tokenizer.json"
            )
        try:
            backend = _Backend.from_file(str(path))
        except Exception as e:  # the Rust parser's errors carry no common Python type
            raise ModelError(path, TOKENIZER_FILE, f"not a valid tokenizers file ({e})") from e
        config_path = directory / TOKENIZER_CONFIG_FILE
        if not config_path.is_file():
            raise ModelError(config_path, TOKENIZER_CONFIG_FILE, "missing: it carries the special tokens")
        config = _read_json(config_path)
        template_path = directory / CHAT_TEMPLATE_FILE
        template = template_path.read_text() if template_path.is_file() else config.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise ModelError(
                config_path,
                "chat_template",
                "must be one template string (named templates are not supported)",
            )
        named = {k: c for k in _NAMED_SPECIALS if (c := _token_content(config.get(k))) is not None}
        tok = cls(backend, chat_template=template, named=named, source=str(directory))
        for key, content in named.items():
            if backend.token_to_id(content) is None:
                raise ModelError(config_path, key, f"{content!r} is not a token of tokenizer.json")
        return tok

    # ---- vocabulary ----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce or decode (base vocabulary plus added tokens)."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def special_id(self, token: str) -> int:
        """The id of an added (special) token; `KeyError` names it if it is unknown."""
        if token not in self._to_id:
            raise KeyError(f"{token!r} is not an added token of {self.source or 'this tokenizer'}")
        return self._to_id[token]

    def has_token(self, token: str) -> bool:
        return self._backend.token_to_id(token) is not None

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    @property
    def eos_id(self) -> int | None:
        eos = self.named_special_tokens.get("eos_token")
        return None if eos is None else self._backend.token_to_id(eos)

    # ---- text ----------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The ids of `text`: by `FastBpe` where it gives the same ids (byte-level BPE), else by the
        `tokenizers` backend without offsets. The proxy encodes every new message of every harness call."""
        fast = self._fast
        return fast.encode(text) if fast is not None else backend_ids(self._backend, text)

    def backend_encode(self, text: str) -> list[int]:
        """The ids of `text` by the `tokenizers` backend."""
        return backend_ids(self._backend, text)

    @functools.cached_property
    def _fast(self) -> FastBpe | None:
        """Built on first use (None where it cannot give the backend's ids)."""
        return FastBpe.build(self._backend)

    @property
    def uses_fast_bpe(self) -> bool:
        """Whether `encode` runs on `FastBpe`."""
        return self._fast is not None

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; `ValueError` for an id outside the vocabulary (a padded row of the embedding,
        which the Rust decoder would drop silently)."""
        ids = list(ids)
        if ids and not 0 <= min(ids) <= max(ids) < self.vocab_size:
            raise ValueError(
                f"token ids outside the vocabulary (size {self.vocab_size}): {min(ids)}..{max(ids)}"
            )
        return str(self._backend.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        """The text of one token as a log-prob triple reports it."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        return self.decode([token_id])

    def template_variables(self) -> dict[str, str]:
        """The special-token strings a chat template may read (`bos_token`, `eos_token`, ...)."""
        return dict(self.named_special_tokens)


def generation_eos_ids(directory: Path) -> tuple[int, ...]:
    """The stop ids of `generation_config.json` (`eos_token_id`, one id or a list); () when absent."""
    path = Path(directory) / GENERATION_CONFIG_FILE
    if not path.is_file():
        return ()
    eos = _read_json(path).get("eos_token_id")
    ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelError(path, "eos_token_id", f"must be an id or a list of ids; got {eos!r}")
    return tuple(ids)


class IncrementalDecoder:
    """Ids → text in pieces whose concatenation equals `decode` of all ids (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def feed(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix : self._read], self._skip)
        text = decode(self._ids[self._prefix :], self._skip)
        if not final and (text.endswith("\ufffd") or len(text) <= len(prefix_text)):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text) :]
