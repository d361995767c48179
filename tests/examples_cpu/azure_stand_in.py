"""A stand-in for Azure OpenAI (data plane) and Azure Resource Manager (deployments), on 127.0.0.1.

Hosted Azure cannot be reached here. This server answers the routes the fine-tuning loop calls, with the request and
response shapes of Azure's REST reference, and checks what Azure checks: the ``api-key`` header and ``api-version``
query on the data plane, a bearer token on Resource Manager, the chat fine-tuning JSONL format of uploaded files,
known file, model and deployment names. Files are ``pending`` until first read; jobs go ``pending`` -> ``running`` ->
``succeeded`` one poll at a time; deployments are ``Creating`` until polled once.

Chat completions (``/openai/v1/chat/completions``, Azure's OpenAI-compatible v1 route) play a model that calls the
first offered tool with the question's last capitalised word (not a question word) as ``country``, then answers with the tool's result.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

API_KEY = "stand-in-api-key"
MANAGEMENT_TOKEN = "stand-in-management-token"
QUESTION_WORDS = {"What", "Which", "Name", "Where"}
DEPLOYMENTS_PATH = (
    "/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.CognitiveServices/accounts/{account}"
    "/deployments/{name}"
)


@dataclass
class AzureState:
    """What the stand-in holds; tests read it."""

    base_models: Dict[str, str] = field(default_factory=lambda: {"gpt-4.1-mini": "gpt-4.1-mini-2025-04-14"})
    files: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    file_contents: Dict[str, bytes] = field(default_factory=dict)
    jobs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    deployments: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    chat_models: List[str] = field(default_factory=list)
    calls: List[str] = field(default_factory=list)
    fail_jobs: bool = False


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _validate_jsonl(content: bytes) -> str:
    """'' when every line is a chat example ending with an assistant message, else what is wrong."""
    lines = [line for line in content.decode("utf-8").splitlines() if line.strip()]
    if not lines:
        return "the file is empty"
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return f"line {number} is not JSON"
        messages = record.get("messages") if isinstance(record, dict) else None
        if not isinstance(messages, list) or not messages or messages[-1].get("role") != "assistant":
            return f"line {number} has no messages list ending with an assistant message"
    return ""


def create_app(state: AzureState) -> FastAPI:
    app = FastAPI()
    ids = itertools.count(1)
    deployments = {name: {"model": model, "state": "Succeeded"} for name, model in state.base_models.items()}
    state.deployments.update(deployments)

    def data_plane_refusal(request: Request) -> Any:
        if request.headers.get("api-key") != API_KEY:
            return _error(401, "401", "Access denied due to invalid subscription key or wrong API endpoint.")
        if not request.query_params.get("api-version"):
            return _error(404, "404", "Resource not found (no api-version)")
        return None

    @app.post("/openai/files")
    async def upload(request: Request) -> Any:
        state.calls.append("upload")
        if (refusal := data_plane_refusal(request)) is not None:
            return refusal
        raw = b"Content-Type: " + request.headers["content-type"].encode() + b"\r\n\r\n" + await request.body()
        form = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(raw)
        parts = {part.get_param("name", header="content-disposition"): part for part in form.iter_parts()}
        if "file" not in parts or parts.get("purpose") is None:
            return _error(400, "invalidPayload", "file and purpose are required")
        purpose = parts["purpose"].get_content().strip()
        content = parts["file"].get_payload(decode=True)
        if purpose != "fine-tune":
            return _error(400, "invalidPayload", f"unsupported purpose {purpose!r}")
        if problem := _validate_jsonl(content):
            return _error(400, "invalidPayload", f"Invalid file format: {problem}")
        file_id = f"file-{next(ids):04d}"
        filename = parts["file"].get_filename()
        state.files[file_id] = {"id": file_id, "object": "file", "purpose": purpose, "filename": filename,
                                "bytes": len(content), "created_at": int(time.time()), "status": "pending"}  # fmt: skip
        state.file_contents[file_id] = content
        return JSONResponse(dict(state.files[file_id]), status_code=201)

    @app.get("/openai/files/{file_id}")
    async def retrieve_file(file_id: str, request: Request) -> Any:
        if (refusal := data_plane_refusal(request)) is not None:
            return refusal
        if file_id not in state.files:
            return _error(404, "fileNotFound", f"file {file_id} not found")
        answer = dict(state.files[file_id])
        state.files[file_id]["status"] = "processed"
        return answer

    @app.post("/openai/fine_tuning/jobs")
    async def create_job(request: Request) -> Any:
        state.calls.append("create_job")
        if (refusal := data_plane_refusal(request)) is not None:
            return refusal
        body = await request.json()
        if body.get("training_file") not in state.files or state.files[body["training_file"]]["status"] != "processed":
            return _error(400, "invalidPayload", f"training file {body.get('training_file')!r} is not processed")
        known = set(state.base_models.values()) | {job["fine_tuned_model"] for job in state.jobs.values()}
        if body.get("model") not in known:
            return _error(400, "invalidPayload", f"model {body.get('model')!r} cannot be fine-tuned")
        job_id = f"ftjob-{next(ids):04d}"
        state.jobs[job_id] = {"id": job_id, "object": "fine_tuning.job", "model": body["model"],
                              "training_file": body["training_file"], "validation_file": None,
                              "created_at": int(time.time()), "status": "pending", "suffix": body.get("suffix"),
                              "seed": body.get("seed"), "hyperparameters": {"n_epochs": "auto"},
                              "fine_tuned_model": None, "result_files": [], "error": None,
                              "organization_id": "", "trained_tokens": None, "finished_at": None}  # fmt: skip
        return JSONResponse(dict(state.jobs[job_id]), status_code=201)

    @app.get("/openai/fine_tuning/jobs/{job_id}")
    async def retrieve_job(job_id: str, request: Request) -> Any:
        state.calls.append("poll_job")
        if (refusal := data_plane_refusal(request)) is not None:
            return refusal
        job = state.jobs.get(job_id)
        if job is None:
            return _error(404, "jobNotFound", f"job {job_id} not found")
        if job["status"] == "pending":
            job["status"] = "running"
        elif job["status"] == "running" and state.fail_jobs:
            job["status"] = "failed"
            job["error"] = {"code": "invalidTrainingData", "message": "stand-in failure", "param": None}
        elif job["status"] == "running":
            job["status"] = "succeeded"
            job["fine_tuned_model"] = (
                f"{job['model'].split('.ft-')[0]}.ft-{job_id.removeprefix('ftjob-')}-{job['suffix']}"
            )
            job["finished_at"] = int(time.time())
        return dict(job)

    def arm_refusal(request: Request) -> Any:
        if request.headers.get("authorization") != f"Bearer {MANAGEMENT_TOKEN}":
            return _error(401, "AuthenticationFailed", "Authentication failed.")
        if not request.query_params.get("api-version"):
            return _error(400, "MissingApiVersionParameter", "The api-version query parameter is required.")
        return None

    def deployment_view(name: str) -> Dict[str, Any]:
        entry = state.deployments[name]
        return {"id": name, "name": name, "type": "Microsoft.CognitiveServices/accounts/deployments",
                "sku": {"name": "standard", "capacity": 1},
                "properties": {"model": {"format": "OpenAI", "name": entry["model"], "version": "1"},
                               "provisioningState": entry["state"]}}  # fmt: skip

    @app.put(DEPLOYMENTS_PATH)
    async def put_deployment(name: str, request: Request) -> Any:
        state.calls.append(f"deploy {name}")
        if (refusal := arm_refusal(request)) is not None:
            return refusal
        body = await request.json()
        model = ((body.get("properties") or {}).get("model") or {}).get("name")
        if model not in {job["fine_tuned_model"] for job in state.jobs.values()} | set(state.base_models.values()):
            return _error(400, "DeploymentModelNotSupported", f"model {model!r} is not available")
        state.deployments[name] = {"model": model, "state": "Creating"}
        return JSONResponse(deployment_view(name), status_code=201)

    @app.get(DEPLOYMENTS_PATH)
    async def get_deployment(name: str, request: Request) -> Any:
        if (refusal := arm_refusal(request)) is not None:
            return refusal
        if name not in state.deployments:
            return _error(404, "DeploymentNotFound", f"deployment {name} not found")
        view = deployment_view(name)
        state.deployments[name]["state"] = "Succeeded"
        return view

    @app.delete(DEPLOYMENTS_PATH)
    async def delete_deployment(name: str, request: Request) -> Any:
        state.calls.append(f"delete {name}")
        if (refusal := arm_refusal(request)) is not None:
            return refusal
        if state.deployments.pop(name, None) is None:
            return _error(404, "DeploymentNotFound", f"deployment {name} not found")
        return JSONResponse(None, status_code=200)

    @app.post("/openai/v1/chat/completions")
    async def chat(request: Request) -> Any:
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return _error(401, "401", "Access denied due to invalid subscription key.")
        body = await request.json()
        deployment = body.get("model")
        if deployment not in state.deployments or state.deployments[deployment]["state"] != "Succeeded":
            return _error(404, "DeploymentNotFound", f"The API deployment {deployment} does not exist.")
        state.chat_models.append(deployment)
        messages = body["messages"]
        last = messages[-1]
        if last["role"] == "user" and body.get("tools"):
            names = [w.strip("?.:,") for w in last["content"].split() if w[:1].isupper()]
            country = [w for w in names if w not in QUESTION_WORDS][-1]
            name = body["tools"][0]["function"]["name"]
            message: Dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{next(ids)}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps({"country": country})}}]}  # fmt: skip
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": f"The capital is {last.get('content')}."}
            finish = "stop"
        return {"id": f"chatcmpl-{next(ids)}", "object": "chat.completion", "created": int(time.time()),
                "model": deployment, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}  # fmt: skip

    return app
