"""The `chatml` chat family: Gyre's compact ChatML, the format of the embedded demo model (`<|im_end|>` turns,
hermes tool calls, reasoning kept).

A module of the chat-family registry (gyre/model/families/__init__.py; how to add one: base.py)."""

from __future__ import annotations

from gyre.model.families.base import ChatFamily

CHAT_TEMPLATE = r"""{#- Gyre's compact ChatML, the chat format of the embedded demo model.
    Turns are <|im_start|>ROLE\n ... <|im_end|> with nothing between turns; tool definitions follow the
    system prompt as "# Tools" and one compact JSON object per line; an assistant turn is
    <think>...</think>, its text, then <tool_call>{"name":...,"arguments":{...}}</tool_call> per call;
    a tool result is a "tool" turn ("tool error" when it failed). Every rendering only appends. -#}
{%- set ns = namespace(start=0) -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.start = 1 -%}
    {%- set system = messages[0].content or '' -%}
{%- else -%}
    {%- set system = '' -%}
{%- endif -%}
{%- if system or tools -%}
    {{- '<|im_start|>system\n' + system -}}
    {%- if tools -%}
        {%- if system -%}{{- '\n' -}}{%- endif -%}
        {{- '# Tools' -}}
        {%- for tool in tools -%}
            {%- set fn = tool.function if tool.function is defined else tool -%}
            {{- '\n' + ({'name': fn.name, 'description': fn.description or '', 'parameters': fn.parameters or {}} | tojson(separators=(',', ':'))) -}}
        {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>' -}}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
    {%- if message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none -%}
            {{- '<think>' + message.reasoning_content + '</think>' -}}
        {%- endif -%}
        {{- message.content or '' -}}
        {%- for call in message.tool_calls or [] -%}
            {%- if call.raw is defined and call.raw -%}
                {{- '<tool_call>' + call.raw + '</tool_call>' -}}
            {%- else -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {{- '<tool_call>' + ({'name': fn.name, 'arguments': fn.arguments} | tojson(separators=(',', ':'))) + '</tool_call>' -}}
            {%- endif -%}
        {%- endfor -%}
        {{- '<|im_end|>' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_start|>tool' + (' error' if message.is_error else '') + '\n' + (message.content or '') + '<|im_end|>' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""
"""Rendered by transformers' own Jinja renderer; `gyre model init` writes it into a new model directory."""

FAMILY = ChatFamily(
    name="chatml",
    chat_template=CHAT_TEMPLATE,
    end_of_turn="<|im_end|>",
    tool_call_parser="hermes",
    special_tokens=(
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<|pad|>",
    ),
    eos_token="<|endoftext|>",
    pad_token="<|pad|>",
    marker="'# Tools'",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    reasoning=True,
)
