"""`FastBpe` gives the ids of the `tokenizers` backend it was built from, or is not used at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as Backend

from gyre.model import fast_bpe
from gyre.model.fast_bpe import FastBpe
from gyre.model.tokenizer import Tokenizer
from tests.support.models import hf_dir, small_dir

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
BPE = Tokenizer.from_dir(hf_dir("qwen3"))
SPEC: dict[str, Any] = json.loads(BPE._backend.to_str())


def _backend(**changes: Any) -> Backend:
    return Backend.from_str(json.dumps({**SPEC, **changes}))


def _qwen2_style() -> Backend:
    """The same vocabulary pre-tokenized as Qwen2/3 and Llama 3 are: an NFC normalizer, a `Split` on
    Qwen2's regex and a regex-free `ByteLevel`."""
    return _backend(
        normalizer={"type": "NFC"},
        pre_tokenizer={
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_PATTERN},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
    )


QWEN2_STYLE = _qwen2_style()
FAST = {
    kind: (b, FastBpe.build(b)) for kind, b in {"gpt2-regex": _backend(), "qwen2-split": QWEN2_STYLE}.items()
}
SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "<tool_call>"]
texts = st.lists(
    st.one_of(st.text(), st.sampled_from(SPECIALS), st.sampled_from([" ", "\n", "\t", "  ", "'s"])),
    max_size=12,
).map("".join)


@pytest.mark.parametrize("kind", sorted(FAST))
@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_same_ids_as_the_backend(kind: str, text: str) -> None:
    backend, fast = FAST[kind]
    assert fast is not None
    assert fast.encode(text) == backend.encode_batch_fast([text], add_special_tokens=False)[0].ids


def test_the_tokenizer_encodes_with_it_where_it_can() -> None:
    bpe, byte = Tokenizer.from_dir(hf_dir("qwen3")), Tokenizer.from_dir(small_dir())
    code = "def forward(self, x):\n    return x  # <|im_end|>\n"
    assert bpe.encode(code) == bpe.backend_encode(code) and bpe.uses_fast_bpe
    assert byte.encode(code) == byte.backend_encode(code) and not byte.uses_fast_bpe  # no regex: one piece


def _renumbered() -> Backend:
    """Two merge products swap ids: the merge order is no longer the id order."""
    vocab = dict(SPEC["model"]["vocab"])
    merges = SPEC["model"]["merges"]
    a, b = ("".join(m) if isinstance(m, list) else m.replace(" ", "") for m in (merges[10], merges[20]))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    return _backend(model={**SPEC["model"], "vocab": vocab})


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(_backend(normalizer={"type": "Lowercase"}), id="normalizer"),
        pytest.param(
            _backend(added_tokens=[{**SPEC["added_tokens"][0], "lstrip": True}, *SPEC["added_tokens"][1:]]),
            id="stripping-added-token",
        ),
        pytest.param(_renumbered(), id="merge-order"),
        pytest.param(_backend(model={**SPEC["model"], "dropout": 0.1}), id="dropout"),
    ],
)
def test_not_used_where_the_structure_differs(backend: Backend) -> None:
    assert FastBpe.build(backend) is None


def test_not_used_where_the_probe_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_bpe, "GPT2_PATTERN", r"\S+|\s+")  # another split than the backend's
    assert FastBpe.build(_backend()) is None
    monkeypatch.undo()
    assert FastBpe.build(_backend()) is not None
