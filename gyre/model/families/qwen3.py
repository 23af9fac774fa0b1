"""The `qwen3` chat family: the format of the Qwen3 checkpoints (ChatML turns, hermes tool calls, `<think>`
reasoning), and its verified append-only template, which keeps each turn's reasoning.

A module of the chat-family registry (gyre/model/families/__init__.py; how to add one: base.py)."""

from __future__ import annotations

from gyre.model.families.base import ChatFamily

CHAT_TEMPLATE = r"""{#- Qwen3 (ChatML, Hermes-style tool calls, <think> reasoning): the verified append-only template of the
    qwen3 family (gyre.trajectory.templates.registry). It renders what the template Qwen3 checkpoints
    ship renders, with three exceptions that make every turn's render a prefix of the next:
    - every assistant turn keeps its reasoning (the shipped template keeps only the turns after the last
      user query, so a new user turn rewrites the earlier ones);
    - an assistant turn carries a <think> block exactly when it has reasoning, an empty one included
      (the shipped template adds an empty block to the last turn only, and drops it once a turn follows);
    - with enable_thinking false every assistant turn starts with the empty block the generation prompt
      gave it, and a tool call the model emitted (`raw`) is rendered as emitted. -#}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}
        {{- messages[0].content + '\n\n' -}}
    {%- endif -%}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" -}}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" -}}
    {{- '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- set no_thinking = enable_thinking is defined and enable_thinking is false -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = message.content or '' -%}
        {%- set reasoning = none -%}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if no_thinking -%}
            {{- '<think>\n\n</think>\n\n' + content -}}
        {%- elif reasoning is not none -%}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
        {%- else -%}
            {{- content -}}
        {%- endif -%}
        {%- for call in message.tool_calls or [] -%}
            {%- if content or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {%- if call.raw is defined and call.raw -%}
                {{- '<tool_call>' + call.raw + '</tool_call>' -}}
            {%- else -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
                {{- fn.arguments if fn.arguments is string else fn.arguments | tojson -}}
                {{- '}\n</tool_call>' -}}
            {%- endif -%}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if no_thinking -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
"""
"""Rendered by transformers' own Jinja renderer; `gyre model init` writes it into a new model directory."""

FAMILY = ChatFamily(
    name="qwen3",
    chat_template=CHAT_TEMPLATE,
    end_of_turn="<|im_end|>",
    tool_call_parser="hermes",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    added_tokens=(
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ),
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    marker="<think>",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    reasoning=True,
    stands_in_for="the template of the Qwen3 checkpoints (thinking mode), e.g. Qwen/Qwen3-8B",
    differences=(
        "Earlier turns keep their reasoning: the shipped template renders <think> only for assistant turns "
        "after the last user query, so each new user turn rewrites every earlier turn; here an assistant turn"
        " keeps the <think> block it was sampled with. Within a tool loop (all turns after one user query: an"
        " agent's usual trajectory) the last-turn prompt is identical to the shipped one; after a second user"
        " query it holds the earlier turns' reasoning too, which the shipped template would have dropped. An "
        "assistant turn with an empty reasoning keeps its empty <think> block (shipped: only on the last "
        "turn), and with enable_thinking=false every assistant turn starts with the empty block its "
        "generation prompt held (shipped: dropped on earlier turns). A tool call is rendered as the model "
        "emitted it."
    ),
)
