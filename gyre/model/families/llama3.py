"""The `llama3` chat family: the format of the Llama 3.1 / 3.2 / 3.3 Instruct checkpoints (header-id turns,
JSON tool calls), and its verified append-only template, tools in the system turn.

A module of the chat-family registry (gyre/model/families/__init__.py; how to add one: base.py)."""

from __future__ import annotations

from gyre.model.families.base import ChatFamily

CHAT_TEMPLATE = r"""{#- Llama 3.1 / 3.2 / 3.3 (header-delimited turns ending in <|eot_id|>, JSON tool calls, "ipython" tool
    results): the verified append-only template of the llama3 family (gyre.trajectory.templates.registry).
    It renders what the template Llama 3.1 checkpoints ship renders, with these exceptions:
    - tool definitions go into the system turn, worded as the shipped template words them there with
      tools_in_user_message=false (by default it prefixes them to the first user message, so the
      system turn and its tools would not be a segment of their own);
    - an assistant turn keeps its text next to its tool calls, may hold several calls (one per line),
      and is not trimmed: it stays as sampled (the shipped template renders one call and no text, and
      trims text);
    - builtin tools (<|python_tag|> calls, <|eom_id|>) are not rendered. -#}
{{- bos_token or '' -}}
{%- set date = date_string if date_string is defined else '26 Jul 2024' -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system = messages[0].content | trim -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system = '' -%}
    {%- set rest = messages -%}
{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools -%}
    {{- 'Environment: ipython\n' -}}
{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: ' + date + '\n\n' -}}
{%- if tools -%}
    {{- 'You have access to the following functions. To call a function, please respond with JSON for a function call.' -}}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' -}}
    {{- 'Do not use variables.\n\n' -}}
    {%- for tool in tools -%}
        {{- (tool | tojson(indent=4)) + '\n\n' -}}
    {%- endfor -%}
{%- endif -%}
{{- system + '<|eot_id|>' -}}
{%- for message in rest -%}
    {%- if message.role == 'assistant' -%}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' + (message.content or '') -}}
        {%- for call in message.tool_calls or [] -%}
            {%- if message.content or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {%- if call.raw is defined and call.raw -%}
                {{- call.raw -}}
            {%- else -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {{- '{"name": "' + fn.name + '", "parameters": ' + (fn.arguments | tojson) + '}' -}}
            {%- endif -%}
        {%- endfor -%}
        {{- '<|eot_id|>' -}}
    {%- elif message.role == 'tool' or message.role == 'ipython' -%}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' -}}
        {%- if message.content is mapping or message.content is iterable -%}
            {{- message.content | tojson -}}
        {%- else -%}
            {{- message.content -}}
        {%- endif -%}
        {{- '<|eot_id|>' -}}
    {%- else -%}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content | trim) + '<|eot_id|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""
"""Rendered by transformers' own Jinja renderer; `gyre model init` writes it into a new model directory."""

FAMILY = ChatFamily(
    name="llama3",
    chat_template=CHAT_TEMPLATE,
    end_of_turn="<|eot_id|>",
    tool_call_parser="llama3_json",
    special_tokens=(
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ),
    bos_token="<|begin_of_text|>",
    eos_token="<|eot_id|>",
    pad_token="<|end_of_text|>",
    marker="<|start_header_id|>",
    stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    stands_in_for=(
        "the template of the Llama 3.1 / 3.2 / 3.3 Instruct checkpoints, e.g. "
        "meta-llama/Llama-3.1-8B-Instruct"
    ),
    differences=(
        "Tool definitions go into the system turn, worded as the shipped template words them there with "
        "tools_in_user_message=false; by default it prefixes them to the first user message, which would make"
        " the system turn and its tools no segment of their own (a sub-agent's root could not be shared). "
        "Without tools, the system and user turns are identical. An assistant turn keeps its text beside its "
        "tool calls, may hold several calls (one per line) and is not trimmed: the shipped template renders "
        "one call and no text (it raises on parallel calls) and trims text, which rewrites a turn that was "
        "sampled otherwise. Builtin tools (<|python_tag|>, <|eom_id|>) are not rendered."
    ),
)
