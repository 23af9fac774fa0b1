"""The `qwen2` chat family: the format of the Qwen2.5 checkpoints (ChatML turns, hermes tool calls), and its
verified append-only template.

A module of the chat-family registry (gyre/model/families/__init__.py; how to add one: base.py)."""

from __future__ import annotations

from gyre.model.families.base import ChatFamily

CHAT_TEMPLATE = r"""{#- Qwen2.5 (ChatML with Hermes-style tool calls): the verified append-only template of the qwen2 family
    (gyre.trajectory.templates.registry). It renders what Qwen2.5 checkpoints ship renders (that
    template is append-only already), except that a tool call the model emitted (`raw`) is rendered as
    emitted. Tools go into the system turn inside <tools></tools>; consecutive tool results share one
    user turn, each inside <tool_response></tool_response>; there is no reasoning. -#}
{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' + (messages[0].content if has_system else default_system) -}}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" -}}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" -}}
    {{- '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- else -%}
    {{- '<|im_start|>system\n' + (messages[0].content if has_system else default_system) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' and not message.tool_calls -%}
        {{- '<|im_start|>assistant\n' + (message.content or '') + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant' -}}
        {%- if message.content -%}
            {{- '\n' + message.content -}}
        {%- endif -%}
        {%- for call in message.tool_calls -%}
            {%- if call.raw is defined and call.raw -%}
                {{- '\n<tool_call>' + call.raw + '</tool_call>' -}}
            {%- else -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + (fn.arguments | tojson) + '}\n</tool_call>' -}}
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
{%- endif -%}
"""
"""Rendered by transformers' own Jinja renderer; `gyre model init` writes it into a new model directory."""

FAMILY = ChatFamily(
    name="qwen2",
    chat_template=CHAT_TEMPLATE,
    end_of_turn="<|im_end|>",
    tool_call_parser="hermes",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    added_tokens=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    marker="<tool_call>",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    catch_all=True,
    stands_in_for="the template of the Qwen2.5 checkpoints, e.g. Qwen/Qwen2.5-7B-Instruct (append-only itself)",
    differences=(
        "None in what it renders for a conversation the proxy builds, except that a tool call is rendered as "
        "the model emitted it (shipped: re-serialized with tojson)."
    ),
)
