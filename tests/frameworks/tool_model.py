"""A tiny Llama whose weights are set by hand so that it calls a tool once, then answers.

A randomly initialised model never writes a tool call, so agent frameworks would never run their tools. This model
is served, tokenized and recorded like any model, and under any sampling temperature it

* answers :data:`TOOL_CALL` (one added token: a ``<tool_call>`` block for ``add(a=2, b=3)``) when the prompt holds no
  tool result, and
* answers :data:`ANSWER` (one added token) when the prompt holds a ``<tool_response>`` block (the chat template's
  rendering of a tool message),

each followed by end-of-turn. How: one decoder layer whose MLP is zero. The generation prompt's last token carries
a query that one attention head matches against the ``<tool_response>`` token (also an added token); its value
writes a "tool result seen" feature, and the output head maps "last prompt token" and "tool result seen" to the
two answers. The query and key live in the slowest rotary dimension with a huge rotary base, so the match does not
depend on positions.
"""

from __future__ import annotations

from pathlib import Path

from agentbolt.models.tiny import create_tiny_model

__all__ = ["TOOL_CALL", "ANSWER", "TOOL_ARGUMENTS", "build_tool_calling_model"]

TOOL_ARGUMENTS = {"a": 2, "b": 3}
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER = "The sum is 5."
_TOOL_RESPONSE = "<tool_response>"

# Residual-stream features.
_LAST, _CALL, _ANSWER, _RESPONSE, _SEEN = 0, 1, 2, 3, 4
_HEAD_DIM = 8
_SLOW = 3  # the rotary pair (3, 7) turns by base ** -0.75 radians per position: nothing, with a base of 1e16


def build_tool_calling_model(path: Path) -> Path:
    """Write the model and its tokenizer to ``path`` (see the module docstring)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    create_tiny_model(path, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([TOOL_CALL, ANSWER, _TOOL_RESPONSE])
    call_id, answer_id, response_id = tokenizer.convert_tokens_to_ids([TOOL_CALL, ANSWER, _TOOL_RESPONSE])
    generation_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    last_id = tokenizer(generation_prompt, add_special_tokens=False).input_ids[-1]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=_HEAD_DIM,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 1e16},
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.zero_()
        embeddings, head = model.model.embed_tokens.weight, model.lm_head.weight
        for token, feature in ((last_id, _LAST), (call_id, _CALL), (answer_id, _ANSWER), (response_id, _RESPONSE)):
            embeddings[token, feature] = 1.0
        attention = model.model.layers[0].self_attn
        # Head 0 (and its key/value head 0): the last prompt token looks for the tool-response token.
        attention.q_proj.weight[_SLOW, _LAST] = 2.0
        attention.k_proj.weight[_SLOW, _RESPONSE] = 2.0
        attention.v_proj.weight[0, _RESPONSE] = 1.0
        attention.o_proj.weight[_SEEN, 0] = 1.0
        head[call_id, _LAST] = 4.0
        head[call_id, _SEEN] = -4.0
        head[answer_id, _SEEN] = 4.0
        head[tokenizer.eos_token_id, _CALL] = 10.0
        head[tokenizer.eos_token_id, _ANSWER] = 10.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
