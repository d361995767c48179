"""OpenAPI documents of the OpenAI-compatible servers, built from the request and response models.

Both servers read and validate their bodies themselves (one parser and one schema for both, see
:mod:`agentbolt.openai_api.http`), so FastAPI cannot infer their documents; each server lists its operations as
:class:`Operation` entries and :func:`openapi_document` turns them into the document served at ``/openapi.json``:
the request schema, the JSON answer, the event stream where there is one, and every error status with its
OpenAI-style body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from agentbolt.openai_api.responses import ErrorResponse, schema_ref, sse_description

__all__ = ["Operation", "openapi_document", "ERROR_DESCRIPTIONS"]

ERROR_DESCRIPTIONS = {
    400: "Invalid request: malformed JSON or a field of the wrong type or out of range (the message names it).",
    401: "Missing or wrong API key (when the server has one).",
    403: "Not allowed (e.g. an adapter path outside the configured directories).",
    404: "Unknown model or route.",
    413: "Request body larger than the server's limit.",
    415: "Content-Type is not application/json.",
    429: "The server's queue is full; retry later.",
    500: "The request failed inside the server.",
    502: "The backend failed or answered something that is not OpenAI-compatible.",
    503: "The model is still loading.",
    504: "The backend did not answer in time.",
}


@dataclass
class Operation:
    """One route of a server's document.

    Attributes:
        method: ``get`` or ``post``.
        path: The route (``/v1/chat/completions``; ``{name}`` for path parameters).
        summary: One line on what it does.
        response: Model of the JSON answer (None: a JSON object described by ``response_description``).
        request: Model of the JSON body (None: no body).
        stream_event: Model of the events of its ``stream: true`` answer, if it can stream.
        errors: Error statuses it can answer, besides the server-wide ones passed to :func:`openapi_document`.
        public: Reachable without the API key.
        response_description: Description of the answer.
        extra_responses: Other statuses it answers (status -> (description, model or None)).
    """

    method: str
    path: str
    summary: str
    response: Optional[Type[BaseModel]] = None
    request: Optional[Type[BaseModel]] = None
    stream_event: Optional[Type[BaseModel]] = None
    errors: Tuple[int, ...] = ()
    public: bool = False
    response_description: str = "Success."
    extra_responses: Dict[int, Tuple[str, Optional[Type[BaseModel]]]] = field(default_factory=dict)


def openapi_document(
    title: str,
    version: str,
    description: str,
    operations: Sequence[Operation],
    *,
    common_errors: Tuple[int, ...] = (),
    auth: bool = False,
) -> Dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``.

    Args:
        title: The API's title.
        version: The API's version.
        description: What the server is.
        operations: Its routes.
        common_errors: Error statuses every route can answer (404 unknown route, 413, ...).
        auth: Whether the server requires a bearer token (then non-public routes document 401 and the scheme).
    """
    models: List[Type[BaseModel]] = [ErrorResponse]
    for operation in operations:
        for model in (operation.request, operation.response, operation.stream_event):
            if model is not None and model not in models:
                models.append(model)
        for _, model in operation.extra_responses.values():
            if model is not None and model not in models:
                models.append(model)
    _, schemas = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    paths: Dict[str, Dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method] = _operation(operation, common_errors, auth)
    document: Dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "components": {"schemas": schemas.get("$defs", {})},
    }
    if auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return document


def _operation(operation: Operation, common_errors: Tuple[int, ...], auth: bool) -> Dict[str, Any]:
    success: Dict[str, Any] = {"description": operation.response_description}
    content: Dict[str, Any] = {
        "application/json": {
            "schema": schema_ref(operation.response.__name__) if operation.response else {"type": "object"}
        }
    }
    if operation.stream_event is not None:
        content["text/event-stream"] = {
            "schema": {"type": "string", "description": sse_description(operation.stream_event)}
        }
        success["description"] += " " + sse_description(operation.stream_event)
    success["content"] = content
    responses: Dict[str, Any] = {"200": success}
    for status, (description, model) in operation.extra_responses.items():
        responses[str(status)] = {
            "description": description,
            "content": {"application/json": {"schema": schema_ref(model.__name__) if model else {"type": "object"}}},
        }
    statuses = set(operation.errors) | set(common_errors)
    if operation.request is not None:
        statuses |= {400, 413, 415}
    if auth and not operation.public:
        statuses.add(401)
    for status in sorted(statuses):
        responses[str(status)] = {
            "description": ERROR_DESCRIPTIONS.get(status, "Error."),
            "content": {"application/json": {"schema": schema_ref(ErrorResponse.__name__)}},
        }
    entry: Dict[str, Any] = {
        "summary": operation.summary,
        "operationId": _operation_id(operation),
        "responses": responses,
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _path_parameters(operation.path)
    ]
    if parameters:
        entry["parameters"] = parameters
    if operation.request is not None:
        entry["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema_ref(operation.request.__name__)}},
        }
    if auth:
        entry["security"] = [] if operation.public else [{"bearer": []}]
    return entry


def _path_parameters(path: str) -> List[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


def _operation_id(operation: Operation) -> str:
    words = [part.strip("{}") for part in operation.path.split("/") if part]
    return "_".join([operation.method, *words]).replace(".", "_")
