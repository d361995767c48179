"""ChatML chat template with tool support, shared by the embedded model and the tiny test model.

The template renders conversations without tools exactly like SmolLM2-Instruct's own template (ChatML with a
default system prompt). When ``tools`` are passed it describes them in the system turn and renders assistant tool
calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks and tool results as
``<tool_response>`` blocks, the convention that :mod:`agentbolt.serving.tool_parser` parses back.
"""

from __future__ import annotations

import json
from typing import Optional

__all__ = ["chatml_tools_template", "TOOL_SYSTEM_PREAMBLE"]

TOOL_SYSTEM_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOL_SYSTEM_SUFFIX = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def chatml_tools_template(default_system: Optional[str] = None) -> str:
    """Build a Jinja chat template for ChatML models with tool calling.

    Args:
        default_system: System prompt inserted when the conversation does not start with a system message
            (``None`` inserts no system turn unless tools are given).

    Returns:
        The template source, suitable for ``tokenizer.chat_template``.
    """
    default = json.dumps(default_system or "")
    has_default = "true" if default_system else "false"
    preamble = json.dumps(TOOL_SYSTEM_PREAMBLE)
    suffix = json.dumps(_TOOL_SYSTEM_SUFFIX)
    return (
        "{%- set ns = namespace(system=" + default + ", has_system=" + has_default + ", start=0) -%}"
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set ns.system = messages[0]['content'] -%}{%- set ns.has_system = true -%}{%- set ns.start = 1 -%}"
        "{%- endif -%}"
        "{%- if tools -%}"
        "{{ '<|im_start|>system\\n' }}{%- if ns.system -%}{{ ns.system + '\\n\\n' }}{%- endif -%}"
        "{{ " + preamble + " }}"
        "{%- for tool in tools -%}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}"
        "{{ " + suffix + " + '<|im_end|>\\n' }}"
        "{%- elif ns.has_system -%}"
        "{{ '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' }}"
        "{%- endif -%}"
        "{%- for message in messages[ns.start:] -%}"
        "{%- if message['role'] == 'tool' -%}"
        "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- elif message['role'] == 'assistant' -%}"
        "{{ '<|im_start|>assistant\\n' }}{%- if message['content'] -%}{{ message['content'] }}{%- endif -%}"
        "{%- if message.get('tool_calls') -%}"
        "{%- for call in message['tool_calls'] -%}"
        "{%- set fn = call['function'] if call.get('function') else call -%}"
        "{%- if message['content'] or not loop.first -%}{{ '\\n' }}{%- endif -%}"
        "{{ '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
        "{%- if fn['arguments'] is string -%}{{ fn['arguments'] }}{%- else -%}{{ fn['arguments'] | tojson }}{%- endif -%}"
        "{{ '}\\n</tool_call>' }}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{{ '<|im_end|>\\n' }}"
        "{%- else -%}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )
