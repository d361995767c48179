"""The chartqa agent: a tiny local PNG travels through the LLM gateway to a stand-in VLM, into spans and adapters."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any, Dict, List

import pytest
from fastapi import FastAPI, Request
from support.fake_openai import FakeOpenAIServer

import agentbolt as agl
from agentbolt.adapter.messages import TraceToMessages
from agentbolt.utils.server_launcher import pick_free_port
from examples.chartqa.agent import ChartQAAgent, chart_reward
from examples.chartqa.charts import ChartTask, make_tasks, read_bars, render_png


def stand_in_vlm(seen: List[Dict[str, Any]]) -> FastAPI:
    """A stand-in for a vision-language model server: it reads the bars of the PNG it is sent (no model)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Dict[str, Any]:
        body = await request.json()
        seen.append(body)
        first = body["messages"][0]["content"]
        url = next(part["image_url"]["url"] for part in first if part["type"] == "image_url")
        bars = read_bars(base64.b64decode(url.removeprefix("data:image/png;base64,")))
        if len(body["messages"]) == 1:
            text = f"{len(bars)} bars, heights {bars}."
        elif "How many" in body["messages"][-1]["content"]:
            text = f"ANSWER: {len(bars)}"
        else:
            text = f"ANSWER: {bars.index(max(bars)) + 1}"
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip

    return app


def test_charts_render_and_read_back() -> None:
    png = render_png([20, 90, 45])
    assert png.startswith(b"\x89PNG") and len(png) < 1000
    bars = read_bars(png)
    assert (
        len(bars) == 3
        and bars.index(max(bars)) == 1
        and all(abs(a - b) <= 2 for a, b in zip(bars, [20, 90, 45], strict=True))
    )
    with pytest.raises(ValueError, match="percentages"):
        render_png([120])
    with pytest.raises(ValueError, match="bars fit"):
        render_png([])


def test_the_image_goes_through_the_gateway_into_spans_and_adapters(tmp_path: Path) -> None:
    tasks = make_tasks(tmp_path, n=2)
    seen: List[Dict[str, Any]] = []

    async def scenario() -> tuple:
        store = agl.InMemoryLightningStore()
        backend = {"model_name": "vlm", "litellm_params": {"model": "openai/vlm", "api_base": server.base_url,
                                                           "api_key": "stand-in"}}  # fmt: skip
        proxy = agl.LLMProxy(port=pick_free_port("127.0.0.1"), model_list=[backend], store=store, launch_mode="asyncio")
        await proxy.start()
        try:
            agent = ChartQAAgent(tmp_path)
            results = []
            for task in tasks:
                rollout = await store.start_rollout(input=task)
                reward = await agent.rollout_async(task, {"main_llm": proxy.as_resource()}, rollout)
                await proxy.flush()
                results.append((reward, list(await store.query_spans(rollout.rollout_id))))
            return results
        finally:
            await proxy.stop()

    with FakeOpenAIServer(app=stand_in_vlm(seen)) as server:
        results = asyncio.run(scenario())

    for task, (reward, spans) in zip(tasks, results, strict=True):
        assert reward == 1.0, (task, seen)
        assert len(spans) == 2  # observe, answer
        sent = (tmp_path / task["image"]).read_bytes()
        conversations = TraceToMessages().adapt(spans)
        image_part = conversations[-1]["messages"][0]["content"][1]
        assert image_part["type"] == "image_url"
        assert base64.b64decode(image_part["image_url"]["url"].split(",", 1)[1]) == sent
    # The backend received the very bytes of the file.
    assert all(
        body["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,") for body in seen
    )


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("ANSWER: 3", 1.0), ("", 0.0), ("How many bars does the chart have?", 0.0), ("ANSWER: 2\nANSWER: 3", 0.0),
     ("ANSWER: 2 or 3", 0.0), ("word " * 3000 + "ANSWER: 4", 0.0), ("ANSWER: 3.0", 0.0)],
)  # fmt: skip
def test_the_reward_is_strict(reply: str, expected: float) -> None:
    task = ChartTask(id="t", image="x.png", question="How many bars does the chart have?", answer="3")
    assert chart_reward(reply, task) == expected


def test_the_command_asks_the_endpoint_and_leaves_no_chart_files_behind(tmp_path: Path) -> None:
    import json

    from support.examples import run_example

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with FakeOpenAIServer(app=stand_in_vlm([])) as server:
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "unused", "TMPDIR": str(scratch)}
        result = run_example(["examples.chartqa.agent", "--model", "vlm", "--limit", "2"], env)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["reward"] for row in rows] == [1.0, 1.0]
    assert list(scratch.iterdir()) == []
