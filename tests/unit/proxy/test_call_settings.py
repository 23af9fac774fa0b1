"""What a harness request turns into on the engine: sampling parameters, the output budget, and the
refusal of values no engine accepts (a 4xx before anything is generated)."""

from __future__ import annotations

import pytest

from gyre.trajectory import Message, template_for_family
from gyre.trajectory.messages import Api, ModelRequest, RequestSampling
from services.proxy.api import api_key_of, check_declared_size
from services.proxy.calls import engine_sampling
from services.proxy.errors import BodyTooLargeError, InvalidRequestError

TEMPLATE = template_for_family("chatml")


def request(**sampling: object) -> ModelRequest:
    return ModelRequest(
        Api.ANTHROPIC, (), (Message.text("user", "hi"),), sampling=RequestSampling(**sampling)
    )  # type: ignore[arg-type]


def test_defaults_stop_on_the_template_turn_end_and_use_the_default_budget() -> None:
    params, budget = engine_sampling(request(), TEMPLATE, 4096)
    assert params == {"stop_token_ids": sorted(TEMPLATE.stop_token_ids)} and budget == 4096


def test_sampling_values_pass_through_and_stop_strings_keep_their_text() -> None:
    params, budget = engine_sampling(
        request(max_tokens=7, temperature=0.5, top_p=0.9, top_k=20, stop=("END",)), TEMPLATE, 4096
    )
    assert budget == 7
    assert params["temperature"] == 0.5 and params["top_p"] == 0.9 and params["top_k"] == 20
    assert params["stop"] == ["END"] and params["no_stop_trim"] is True


@pytest.mark.parametrize(
    "sampling",
    [
        {"max_tokens": 0},
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"stop": ("",)},
    ],
)
def test_values_no_engine_accepts_are_refused(sampling: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        engine_sampling(request(**sampling), TEMPLATE, 4096)


def test_api_keys_come_from_x_api_key_or_a_bearer_token() -> None:
    assert api_key_of({"x-api-key": " k1 "}) == "k1"
    assert api_key_of({"authorization": "Bearer k2"}) == "k2"
    assert api_key_of({"authorization": "bearer  k3"}) == "k3"
    assert api_key_of({"authorization": "Basic abc"}) is None
    assert api_key_of({"authorization": "Bearer "}) is None
    assert api_key_of({}) is None


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read() -> None:
    check_declared_size({"content-length": "10"}, 10)
    check_declared_size({"content-length": "junk"}, 10)
    with pytest.raises(BodyTooLargeError):
        check_declared_size({"content-length": "11"}, 10)
