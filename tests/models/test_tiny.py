"""The tiny random Llama: deterministic, loadable, with a byte-level tokenizer and a tool-aware chat template."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentbolt.models import model_info, resolve_model  # noqa: E402
from agentbolt.models.chat_template import chatml_tools_template  # noqa: E402
from agentbolt.models.tiny import create_tiny_model  # noqa: E402

# SmolLM2-135M-Instruct's own template; ours must render tool-free conversations identically.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("tiny"), seed=3)


def test_same_seed_same_weights_other_seed_other_weights(tiny_dir: Path, tmp_path: Path) -> None:
    again = create_tiny_model(tmp_path / "again", seed=3)
    other = create_tiny_model(tmp_path / "other", seed=4)
    load = transformers.AutoModelForCausalLM.from_pretrained
    a, b, c = (load(p).state_dict() for p in (tiny_dir, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_tokenizer_round_trips_any_text(tiny_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    text = 'héllo wörld <tool_call>{"name": "f"}</tool_call> 🙂'
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    assert len(tokenizer) < 300


def test_seeded_sampling_is_deterministic(tiny_dir: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir)
    prompt = torch.tensor([[5, 6, 7, 8]])
    outs = []
    for _ in range(2):
        torch.manual_seed(11)
        outs.append(model.generate(prompt, max_new_tokens=12, do_sample=True, min_new_tokens=12))
    assert torch.equal(outs[0], outs[1]) and outs[0].shape[1] == 16


def test_chat_template_renders_tools_and_tool_calls(tiny_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\n3\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_template_matches_smollm2_without_tools() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    ours = chatml_tools_template("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    for messages in (
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    ):
        for generation_prompt in (True, False):
            rendered = [
                render_jinja_template(
                    conversations=[messages], chat_template=template, add_generation_prompt=generation_prompt
                )[0][0]
                for template in (ours, SMOLLM2_TEMPLATE)
            ]
            assert rendered[0] == rendered[1]


def test_tiny_model_resolves_as_local_dir(tiny_dir: Path) -> None:
    assert resolve_model(str(tiny_dir)).source == "local"
    info = model_info(str(tiny_dir))
    assert info["hidden_size"] == 32 and info["num_hidden_layers"] == 2 and info["has_chat_template"] is True
