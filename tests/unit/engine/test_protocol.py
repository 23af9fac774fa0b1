"""Parsing SGLang's /generate body: defaults, validation, and refusing what is not implemented."""

from __future__ import annotations

from typing import Any

import pytest

from gyre.model.tokenizer import Tokenizer
from services.cell_agent.engine.protocol import DEFAULT_MAX_NEW_TOKENS, RequestRefused, parse_generate
from tests.support.models import small_dir

TOK = Tokenizer.from_dir(small_dir())


def parse(body: dict[str, Any], max_seq_len: int = 512) -> Any:
    return parse_generate(body, TOK, 264, max_seq_len)


def test_defaults_follow_sglang() -> None:
    req = parse({"input_ids": [1, 2, 3]})
    s = req.sampling
    assert (s.max_new_tokens, s.temperature, s.top_p, s.top_k, s.min_p) == (
        DEFAULT_MAX_NEW_TOKENS,
        1.0,
        1.0,
        -1,
        0.0,
    )
    assert s.skip_special_tokens and not s.no_stop_trim and not s.ignore_eos
    assert not req.return_logprob and not req.stream and len(req.rid) == 32


def test_text_input_is_byte_encoded_and_stop_accepts_a_string() -> None:
    req = parse({"text": "hé", "rid": "r1", "sampling_params": {"stop": "\n", "stop_token_ids": [258]}})
    assert req.input_ids == (104, 195, 169) and req.rid == "r1"
    assert req.sampling.stop == ("\n",) and req.sampling.stop_token_ids == frozenset({258})


def test_max_new_tokens_none_fills_the_context() -> None:
    assert (
        parse(
            {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": None}}, 64
        ).sampling.max_new_tokens
        == 54
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({}, "Either text or input_ids"),
        ({"input_ids": []}, "cannot be empty"),
        ({"input_ids": [[1, 2]]}, "batched"),
        ({"input_ids": [300]}, "token ids"),
        ({"input_ids": [1] * 40 + [-1] + [2] * 40}, "got -1"),
        ({"input_ids": [1] * 40 + [True]}, "got True"),
        ({"input_ids": [1, 2.0]}, "got 2.0"),
        ({"input_ids": [1, "3"]}, "got '3'"),
        ({"input_ids": [1], "rid": ["a"]}, "rid"),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k"),
        ({"input_ids": [1], "sampling_params": {"n": 2}}, "n=2"),
        ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty"),
        ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "regex"),
        ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "bogus"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": True}}, "max_new_tokens"),
        ({"input_ids": [1], "top_logprobs_num": 3}, "top_logprobs_num"),
        ({"input_ids": [1], "logprob_start_len": 0}, "logprob_start_len"),
        ({"input_ids": [1] * 500, "sampling_params": {"max_new_tokens": 20}}, "maximum context length"),
    ],
)
def test_invalid_requests_are_refused_with_a_named_reason(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(RequestRefused, match=fragment) as info:
        parse(body)
    assert info.value.status_code == 400


def test_bookkeeping_fields_are_ignored() -> None:
    req = parse(
        {"input_ids": [1], "log_metrics": False, "priority": 3, "sampling_params": {"stream_interval": 4}}
    )
    assert req.input_ids == (1,)
