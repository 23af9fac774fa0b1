"""The output streamer emits exactly what the final parse records, however the ids are chunked, and
it does stream: text after a decided head goes out before the output ends."""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.model.tokenizer import Tokenizer
from gyre.model.vocab import family_tokenizer
from gyre.trajectory import TextBlock, ThinkingBlock, template_for_family
from gyre.trajectory.output import PARSERS, HermesParser, ParsedCall, ToolCallParser
from gyre.trajectory.templates import ChatTemplate, HFChatTemplate
from services.proxy.streaming import (
    STREAMERS,
    BufferedStreamer,
    Detokenizer,
    StreamEvent,
    TextDelta,
    TextEnd,
    ThinkingDone,
    ToolCallDone,
    fold_events,
    make_streamer,
)
from tests.support.models import small_dir

TOKENIZER = Tokenizer.from_dir(small_dir())
THINK, END_THINK = TOKENIZER.special_id("<think>"), TOKENIZER.special_id("</think>")
CALL, END_CALL = TOKENIZER.special_id("<tool_call>"), TOKENIZER.special_id("</tool_call>")
IM_END, EOS = TOKENIZER.special_id("<|im_end|>"), TOKENIZER.special_id("<|endoftext|>")
SEED, PREFIX = b"path-digest-seed", "toolu_"

PIECES: list[list[int]] = [
    list(b"hello "),
    list(" né \u2603 ".encode()),
    [0xC3],
    [0xA9],
    [0xFF],
    list(b"  \n"),
    [THINK],
    [END_THINK],
    [CALL],
    [END_CALL],
    list(b"<think>"),
    list(b"</think>"),
    list(b"<tool_call>"),
    list(b"</tool_"),
    list(b"call>"),
    list(b'{"name": "Bash", "arguments": {"command": "ls"}}'),
    list(b'{"name": "f", "arguments": "{\\"a\\": 1}"}'),
    list(b'{"name": 3}'),
    list(b"{not json"),
    [IM_END],
    [EOS],
]


outputs = st.lists(st.sampled_from(PIECES), min_size=1, max_size=10).map(
    lambda ps: [i for p in ps for i in p]
)


def stream(template: ChatTemplate, ids: list[int], cuts: list[int]) -> list[StreamEvent]:
    text = Detokenizer(template)
    streamer = make_streamer(template, SEED, PREFIX)
    events: list[StreamEvent] = []
    bounds = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    for a, b in itertools.pairwise(bounds):
        events += streamer.feed(text.feed(ids[a:b]))
    events += streamer.feed(text.finish())
    stopped = bool(ids) and ids[-1] in template.stop_token_ids
    return events + streamer.finish(stopped)


@settings(max_examples=400, deadline=None)
@given(
    ids=outputs, stop=st.sampled_from([[], [IM_END], [EOS]]), cuts=st.lists(st.integers(0, 400), max_size=12)
)
def test_streamed_events_fold_into_the_recorded_parse(
    ids: list[int], stop: list[int], cuts: list[int]
) -> None:
    ids = ids + stop
    template = template_for_family("chatml")
    expected = template.parse_output(ids, SEED, PREFIX)
    events = stream(template, ids, cuts)  # type: ignore[arg-type]
    assert fold_events(events, expected.stopped) == expected
    assert not any(isinstance(e, TextDelta) and not e.text for e in events)


@settings(max_examples=200, deadline=None)
@given(ids=outputs, cuts=st.lists(st.integers(0, 400), max_size=12))
def test_detokenizer_matches_one_shot_decoding(ids: list[int], cuts: list[int]) -> None:
    template = template_for_family("chatml")
    text = Detokenizer(template)
    bounds = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    pieces = [text.feed(ids[a:b]) for a, b in itertools.pairwise(bounds)]
    assert "".join(pieces) + text.finish() == template.decode_output(ids)
    expected = template.parse_output([*ids, IM_END], SEED, PREFIX)
    assert fold_events(stream(template, [*ids, IM_END], cuts), True) == expected


def test_text_streams_once_the_head_is_decided() -> None:
    template = template_for_family("chatml")
    text, streamer = Detokenizer(template), make_streamer(template, SEED, PREFIX)
    assert streamer.feed(text.feed([THINK, *b"plan"])) == []  # thinking is undecided until </think>
    assert streamer.feed(text.feed([END_THINK, *b"Hello wor"])) == [
        ThinkingDone("plan"),
        TextDelta("Hello wor"),
    ]
    assert streamer.feed(text.feed(list(b"ld <tool_"))) == [TextDelta("ld ")]  # a partial <tool_call> waits
    call = b'{"name": "Bash", "arguments": {"command": "ls"}}'
    events = streamer.feed(text.feed([*b"call>", *call, END_CALL, IM_END]))
    assert events[0] == TextEnd() and isinstance(events[1], ToolCallDone)
    assert events[1].call.name == "Bash" and events[1].call.raw == call.decode()
    assert streamer.feed(text.finish()) + streamer.finish(True) == []


def test_a_malformed_call_stays_text_and_the_text_block_continues() -> None:
    template = template_for_family("chatml")
    ids = [*b"a", CALL, *b"{bad", END_CALL, *b"b", CALL, *b'{"name": "f", "arguments": {}}', END_CALL, IM_END]
    events = stream(template, ids, [1, 2, 3, 5, 9])
    folded = fold_events(events, True)
    assert folded == template.parse_output(ids, SEED, PREFIX)
    assert folded.text == "a<tool_call>{bad</tool_call>b" and len(folded.tool_calls) == 1


def test_out_of_vocabulary_ids_raise_value_error() -> None:
    with pytest.raises(ValueError):
        Detokenizer(template_for_family("chatml")).feed([TOKENIZER.vocab_size + 3])


class _EverythingIsText(ToolCallParser):
    name = "everything_is_text"

    def parse(self, text: str) -> list[TextBlock | ThinkingBlock | ParsedCall]:
        return HermesParser().parse(text.upper())


def test_a_parser_without_a_streamer_is_buffered_and_still_exact() -> None:
    template = copy.copy(template_for_family("chatml"))  # the family's template is shared: change a copy
    template.parser = _EverythingIsText()
    streamer = make_streamer(template, SEED, PREFIX)
    assert isinstance(streamer, BufferedStreamer)
    ids = [*b"<tool_call>", *b'{"NAME": "F", "ARGUMENTS": {}}', *b"</tool_call> ok", IM_END]
    text = Detokenizer(template)
    assert streamer.feed(text.feed(ids)) == []
    events = streamer.feed(text.finish()) + streamer.finish(True)
    assert fold_events(events, True) == template.parse_output(ids, SEED, PREFIX)


@pytest.mark.parametrize("parser_name", sorted(STREAMERS))
def test_every_registered_streamer_belongs_to_a_registered_parser(parser_name: str) -> None:
    assert parser_name in PARSERS
    template = HFChatTemplate(
        family_tokenizer("chatml"), end_of_turn="<|im_end|>", tool_call_parser=parser_name
    )
    assert type(make_streamer(template, SEED, PREFIX)) is STREAMERS[parser_name]
