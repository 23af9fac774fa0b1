"""Byte-level tokenizers of a chat family, built locally with the `tokenizers` library (no hub).

- `bpe`: byte-level BPE trained on the text that ships with Gyre (its own Python sources and docs,
  in path order, so one release always trains the same vocabulary);
- `byte`: one token per byte (ids 0..255, GPT-2's byte-to-character alphabet) and the family's
  added tokens after them, no merges — the tokenizer of the embedded demo model.

    backend = build_tokenizer(FAMILIES["qwen3"], "bpe", vocab_size=8192)
    tokenizer = family_tokenizer("chatml")        # an in-memory `gyre.model.tokenizer.Tokenizer`
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from gyre.model.families import FAMILIES, ChatFamily
from gyre.model.fast_bpe import bytes_to_unicode
from gyre.model.tokenizer import Tokenizer as GyreTokenizer
from gyre.paths import REPO_ROOT

TOKENIZER_KINDS = ("bpe", "byte")


def corpus_files() -> list[Path]:
    """The text Gyre ships (its sources and docs), in a stable order: the BPE training corpus."""
    root = REPO_ROOT
    files: list[Path] = []
    for package in ("gyre", "services", "harness", "sim", "bench", "docs"):
        base = root / package
        if base.is_dir():
            files += sorted(
                p
                for p in base.rglob("*")
                if p.suffix in (".py", ".md") and p.is_file() and "v1" not in p.parts
            )
    readme = root / "README.md"
    return [*files, readme] if readme.is_file() else files


def _added(family: ChatFamily) -> list[AddedToken]:
    return [AddedToken(t, special=True, normalized=False) for t in family.special_tokens] + [
        AddedToken(t, special=False, normalized=False) for t in family.added_tokens
    ]


def build_tokenizer(family: ChatFamily, kind: str = "bpe", vocab_size: int = 8192) -> Tokenizer:
    """A byte-level tokenizer of `family` with `vocab_size` ids in total (`byte`: 256 + specials)."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer kind must be one of {TOKENIZER_KINDS}; got {kind!r}")
    num_added = len(family.special_tokens) + len(family.added_tokens)
    if kind == "byte":
        vocab = {ch: b for b, ch in bytes_to_unicode().items()}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    else:
        if vocab_size - num_added < 512:
            raise ValueError(f"vocab_size must leave at least 512 BPE tokens; got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size - num_added,
            min_frequency=2,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train([str(p) for p in corpus_files()], trainer)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(_added(family))
    return tok


@functools.cache
def family_tokenizer(name: str, kind: str = "byte", vocab_size: int = 8192) -> GyreTokenizer:
    """A tokenizer of family `name` with its chat template, in memory (tests, benches, trace replay);
    built once per process (the BPE kind trains in about a second)."""
    family = FAMILIES[name]
    named = {"eos_token": family.eos_token}
    if family.bos_token:
        named["bos_token"] = family.bos_token
    if family.pad_token:
        named["pad_token"] = family.pad_token
    return GyreTokenizer(
        build_tokenizer(family, kind, vocab_size),
        chat_template=family.chat_template,
        named=named,
        source=f"family:{name}",
    )
