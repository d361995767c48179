"""A vision-language agent answering questions about bar charts through any OpenAI-compatible VLM endpoint.

Two steps per rollout, as a small version of an observe-then-answer chart workflow: the model first describes the
chart (the image goes in the user message as an ``image_url`` content part holding a ``data:image/png;base64`` URL),
then answers the question from the image and its own description, ending with ``ANSWER: <n>``. The reward is 1.0 for
the gold integer on that last line and 0.0 otherwise (``examples.calc.task.parse_answer``: a hedge with several
answers, an expression or no answer line scores 0).

The endpoint is the ``main_llm`` resource: under a ``Trainer`` usually the LLM gateway (a ``ProxyLLM``) in front of a
VLM server (vLLM serving Qwen2-VL, or a hosted API), so every call, image included, is recorded as a span.

Run the agent once against an endpoint of your own::

    OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... python -m examples.chartqa.agent --model gpt-4o-mini

Without ``OPENAI_API_KEY``, or when ``OPENAI_BASE_URL`` does not answer, the command stops at once with exit code 2;
a call the service refuses (a wrong key, a model it does not serve) stops it with one line and exit code 2 too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

from openai import AsyncOpenAI

import agentbolt as agl
from examples.calc.task import parse_answer
from examples.chartqa.charts import ChartTask, data_url, make_tasks
from examples.common.arguments import count
from examples.common.environment import reporting_refusals, require_openai_service

OBSERVE_PROMPT = "Describe this bar chart: how many bars there are and how tall each one is, from left to right."
ANSWER_PROMPT = "{question}\nThink briefly, then end with a last line of the form ANSWER: <number>."
MAX_CHARTS = 1000  # each is drawn and written before the first question: a typo must not fill the disk


def chart_reward(reply: Optional[str], task: ChartTask) -> float:
    """1.0 when the reply's single ``ANSWER:`` line holds the gold integer, else 0.0."""
    return 1.0 if parse_answer(reply) == int(task["answer"]) else 0.0


def image_message(text: str, png: bytes) -> Dict[str, Any]:
    """A user message with a text part and the image as a data URL."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url(png)}}],
    }


async def answer_chart(client: AsyncOpenAI, model: str, task: ChartTask, image_dir: Path) -> str:
    """Observe, then answer; returns the final reply."""
    png = (image_dir / task["image"]).read_bytes()
    messages: List[Dict[str, Any]] = [image_message(OBSERVE_PROMPT, png)]
    observed = await client.chat.completions.create(model=model, messages=messages, max_tokens=128, temperature=0)  # type: ignore[arg-type]
    messages.append({"role": "assistant", "content": observed.choices[0].message.content or ""})
    messages.append({"role": "user", "content": ANSWER_PROMPT.format(question=task["question"])})
    answered = await client.chat.completions.create(model=model, messages=messages, max_tokens=128, temperature=0)  # type: ignore[arg-type]
    return answered.choices[0].message.content or ""


class ChartQAAgent(agl.LitAgent[ChartTask]):
    """The chart agent as a ``LitAgent``: reads images from ``image_dir``, calls the ``main_llm`` resource."""

    def __init__(self, image_dir: Path) -> None:
        super().__init__()
        self.image_dir = Path(image_dir)

    async def rollout_async(self, task: ChartTask, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        llm = resources["main_llm"]
        assert isinstance(llm, agl.LLM)
        base_url = llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)  # the gateway's rollout route
        async with AsyncOpenAI(base_url=base_url, api_key=llm.api_key or "unused") as client:
            reply = await answer_chart(client, llm.model, task, self.image_dir)
        return chart_reward(reply, task)


async def _debug(model: str, limit: int) -> None:
    """Ask the endpoint about ``limit`` charts drawn in a temporary directory (removed afterwards)."""
    async with AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY")
    ) as client:
        with tempfile.TemporaryDirectory(prefix="chartqa-") as folder:
            directory = Path(folder)
            for task in make_tasks(directory, n=limit):
                reply = await answer_chart(client, model, task, directory)
                print(json.dumps({"id": task["id"], "question": task["question"], "gold": task["answer"],
                                  "reply": reply, "reward": chart_reward(reply, task)}))  # fmt: skip


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.chartqa.agent", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a vision-language model the endpoint serves")
    parser.add_argument(
        "--limit",
        type=count(1, maximum=MAX_CHARTS),
        default=4,
        help=f"charts to ask about (default: 4, at most {MAX_CHARTS})",
    )
    args = parser.parse_args(argv)
    require_openai_service(
        parser,
        needed_by="the chartqa agent",
        alternative="serve a vision-language model locally (vllm serve Qwen/Qwen2-VL-2B-Instruct) and point "
        "OPENAI_BASE_URL at its /v1",
    )
    with reporting_refusals(
        parser,
        service="the OpenAI-compatible service",
        configure="check OPENAI_API_KEY (the key of the service at OPENAI_BASE_URL) and --model (a model it serves)",
    ):
        asyncio.run(_debug(args.model, args.limit))


if __name__ == "__main__":
    main()
