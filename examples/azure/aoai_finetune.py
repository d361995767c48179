"""Supervised fine-tuning on Azure OpenAI from an agent's traces: roll out, filter, upload, fine-tune, deploy, evaluate.

Each iteration of :class:`AzureOpenAIFinetune`:

1. publishes the current deployment as the ``llm`` resource and rolls the training tasks out through it;
2. turns each rollout's spans into one chat conversation (``TraceToMessages``: the last LLM call holds the whole
   exchange, tool calls and tool results included) and keeps the best-rewarded share (``data_filter_ratio``);
3. uploads them as a fine-tune JSONL file (``POST {endpoint}/openai/files``, ``purpose=fine-tune``) and waits until
   the file is ``processed``;
4. creates a fine-tuning job (``POST {endpoint}/openai/fine_tuning/jobs``) on the current model and polls it until it
   succeeds (its ``fine_tuned_model``), fails or is cancelled;
5. deploys the new model through Azure Resource Manager (``PUT .../Microsoft.CognitiveServices/accounts/{account}/
   deployments/{name}``), deleting the oldest of its own deployments past ``max_deployments``, and waits for
   ``provisioningState: Succeeded``;
6. rolls the validation tasks out on the new deployment and records their mean reward.

The data-plane calls go through the ``openai`` SDK's ``AsyncAzureOpenAI`` client (``api-key`` header, ``api-version``
query); the deployment calls through ``httpx`` with an Azure AD bearer token (``AZURE_MANAGEMENT_TOKEN``, else
``az account get-access-token``). The agent itself calls the deployments through Azure's OpenAI-compatible v1
route, ``{endpoint}/openai/v1``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import httpx

import agentbolt as agl
from agentbolt.adapter.messages import TraceToMessages
from examples.common.environment import missing_variables
from examples.common.rollouts import roll_out

logger = logging.getLogger("examples.azure.aoai_finetune")

TERMINAL_JOB_STATES = {"succeeded", "failed", "cancelled"}


class AzureFineTuningError(RuntimeError):
    """A file, job or deployment on Azure ended in a failed state, or a call was refused."""


@dataclass
class AzureOpenAIConfig:
    """Where the Azure OpenAI resource is and how to reach it.

    ``management_endpoint`` and ``management_token`` are for Azure Resource Manager (deployments); everything else is
    the resource's data plane.
    """

    endpoint: str
    api_key: str
    subscription_id: str
    resource_group: str
    resource_name: str
    api_version: str = "2024-10-21"
    management_endpoint: str = "https://management.azure.com"
    management_api_version: str = "2024-10-01"
    management_token: Optional[str] = None

    ENV = {
        "endpoint": "AZURE_OPENAI_ENDPOINT",
        "api_key": "AZURE_OPENAI_API_KEY",
        "subscription_id": "AZURE_SUBSCRIPTION_ID",
        "resource_group": "AZURE_RESOURCE_GROUP",
        "resource_name": "AZURE_OPENAI_RESOURCE_NAME",
        "api_version": "AZURE_OPENAI_API_VERSION",
        "management_endpoint": "AZURE_MANAGEMENT_ENDPOINT",
        "management_token": "AZURE_MANAGEMENT_TOKEN",
    }
    REQUIRED = ("endpoint", "api_key", "subscription_id", "resource_group", "resource_name")

    @classmethod
    def from_env(cls, environ: Optional[Dict[str, str]] = None) -> AzureOpenAIConfig:
        """Read the configuration from the environment (names in :attr:`ENV`).

        Raises:
            ValueError: A required variable is missing (all missing ones are named).
        """
        environ = dict(os.environ if environ is None else environ)
        missing = missing_variables([cls.ENV[name] for name in cls.REQUIRED], environ)
        if missing:
            raise ValueError(f"Azure OpenAI is not configured: set {', '.join(missing)}")
        values = {name: environ[var] for name, var in cls.ENV.items() if environ.get(var)}
        values["endpoint"] = values["endpoint"].rstrip("/")
        return cls(**values)

    @property
    def inference_base_url(self) -> str:
        """Azure's OpenAI-compatible v1 route: an ``openai.OpenAI(base_url=...)`` calls deployments by name."""
        return f"{self.endpoint}/openai/v1"

    def deployment_url(self, deployment: str) -> str:
        """The Resource Manager URL of one deployment of the resource."""
        return (
            f"{self.management_endpoint.rstrip('/')}/subscriptions/{self.subscription_id}/resourceGroups/"
            f"{self.resource_group}/providers/Microsoft.CognitiveServices/accounts/{self.resource_name}/"
            f"deployments/{deployment}"
        )


def management_token(config: AzureOpenAIConfig) -> str:
    """The Resource Manager bearer token: the configured one, else the Azure CLI's (``az login`` first)."""
    if config.management_token:
        return config.management_token
    command = ["az", "account", "get-access-token", "--resource", "https://management.azure.com", "-o", "json"]
    try:
        output = subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise AzureFineTuningError(
            f"no AZURE_MANAGEMENT_TOKEN and the Azure CLI gave no token ({exc}); run 'az login' or set the variable"
        ) from exc
    return json.loads(output)["accessToken"]


class AzureOpenAIFineTuning:
    """The Azure calls of the loop: upload, fine-tune, deploy, delete. One instance per loop (it keeps clients)."""

    def __init__(self, config: AzureOpenAIConfig, *, poll_interval: float = 30.0, timeout: float = 6 * 3600.0):
        from openai import AsyncAzureOpenAI

        self.config = config
        self.poll_interval = poll_interval
        self.timeout = timeout
        self._openai = AsyncAzureOpenAI(
            azure_endpoint=config.endpoint, api_key=config.api_key, api_version=config.api_version
        )
        self._arm = httpx.AsyncClient(timeout=60.0)

    async def close(self) -> None:
        """Close the HTTP clients."""
        await self._openai.close()
        await self._arm.aclose()

    async def _poll(self, what: str, check: Any) -> Any:
        """Call ``check()`` every ``poll_interval`` seconds until it returns something other than None."""
        deadline = asyncio.get_running_loop().time() + self.timeout
        while True:
            result = await check()
            if result is not None:
                return result
            if asyncio.get_running_loop().time() > deadline:
                raise AzureFineTuningError(f"{what} did not finish within {self.timeout:g} seconds")
            await asyncio.sleep(self.poll_interval)

    async def upload_training_file(self, jsonl: bytes, filename: str) -> str:
        """Upload a fine-tune JSONL file and wait until Azure has processed it; returns the file id."""
        created = await self._openai.files.create(file=(filename, jsonl, "application/jsonl"), purpose="fine-tune")
        logger.info("Uploaded %s (file_id=%s).", filename, created.id)

        async def processed() -> Optional[str]:
            file = await self._openai.files.retrieve(created.id)
            if file.status == "error":
                raise AzureFineTuningError(f"file {created.id} was rejected: {file.status_details}")
            return created.id if file.status == "processed" else None

        return await self._poll(f"processing of file {created.id}", processed)

    async def fine_tune(self, base_model: str, training_file: str, *, suffix: str, seed: Optional[int] = None) -> str:
        """Create a fine-tuning job and wait for it; returns the fine-tuned model's id."""
        extra = {"seed": seed} if seed is not None else {}
        job = await self._openai.fine_tuning.jobs.create(
            model=base_model, training_file=training_file, suffix=suffix, **extra
        )
        logger.info("Fine-tuning job %s created for %s.", job.id, base_model)

        async def finished() -> Optional[str]:
            current = await self._openai.fine_tuning.jobs.retrieve(job.id)
            if current.status not in TERMINAL_JOB_STATES:
                return None
            if current.status != "succeeded" or not current.fine_tuned_model:
                reason = current.error.message if current.error else "no fine-tuned model"
                raise AzureFineTuningError(f"fine-tuning job {job.id} ended {current.status}: {reason}")
            return current.fine_tuned_model

        model = await self._poll(f"fine-tuning job {job.id}", finished)
        logger.info("Fine-tuning job %s succeeded: %s.", job.id, model)
        return model

    async def _arm_request(self, method: str, deployment: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {management_token(self.config)}"}
        params = {"api-version": self.config.management_api_version}
        response = await self._arm.request(
            method, self.config.deployment_url(deployment), headers=headers, params=params, **kwargs
        )
        if response.status_code >= 400:
            raise AzureFineTuningError(
                f"{method} deployment {deployment}: HTTP {response.status_code}: {response.text[:500]}"
            )
        return response

    async def deploy(self, deployment: str, model: str, *, sku: str = "standard", capacity: int = 1) -> None:
        """Create (or update) a deployment of ``model`` and wait until it is provisioned."""
        body = {
            "sku": {"name": sku, "capacity": capacity},
            "properties": {"model": {"format": "OpenAI", "name": model, "version": "1"}},
        }
        await self._arm_request("PUT", deployment, json=body)

        async def provisioned() -> Optional[bool]:
            state = (await self._arm_request("GET", deployment)).json()["properties"]["provisioningState"]
            logger.info("Deployment %s: %s.", deployment, state)
            if state in ("Failed", "Canceled"):
                raise AzureFineTuningError(f"deployment {deployment} ended {state}")
            return True if state == "Succeeded" else None

        await self._poll(f"deployment {deployment}", provisioned)

    async def delete_deployment(self, deployment: str) -> None:
        """Delete a deployment (the fine-tuned model itself stays)."""
        await self._arm_request("DELETE", deployment)
        logger.info("Deleted deployment %s.", deployment)


def fine_tune_jsonl(conversations: Sequence[Dict[str, Any]]) -> bytes:
    """Azure OpenAI's chat fine-tuning format: one ``{"messages": [...], "tools": [...]}`` object per line."""
    lines = []
    for conversation in conversations:
        record: Dict[str, Any] = {"messages": conversation["messages"]}
        if conversation.get("tools"):
            record["tools"] = conversation["tools"]
        lines.append(json.dumps(record, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode() if lines else b""


@dataclass
class RolledOut:
    """One finished rollout: its final reward and the conversation of its last LLM call (None if it made none)."""

    reward: float
    conversation: Optional[Dict[str, Any]]


def select_examples(rollouts: Sequence[RolledOut], ratio: float) -> List[Dict[str, Any]]:
    """The conversations of the best ``ratio`` share of the rewarded rollouts (ties kept in rollout order)."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"data_filter_ratio must be in (0, 1], got {ratio}")
    rewarded = [r for r in rollouts if r.conversation is not None and r.reward > 0.0]
    keep = math.ceil(len(rewarded) * ratio)
    ranked = sorted(range(len(rewarded)), key=lambda i: -rewarded[i].reward)[:keep]
    return [rewarded[i].conversation for i in sorted(ranked)]  # type: ignore[misc]


@dataclass
class IterationRecord:
    """What one fine-tune -> deploy -> evaluate iteration produced."""

    iteration: int
    train_reward: float
    examples: int
    file_id: str
    model: str
    deployment: str
    val_reward: float


class AzureOpenAIFinetune(agl.Algorithm):
    """The fine-tune -> deploy -> evaluate loop (see the module docstring).

    Args:
        config: The Azure resource.
        base_deployment: The deployment the first rollouts use (e.g. ``gpt-4.1-mini``).
        base_model: The model the first job fine-tunes (e.g. ``gpt-4.1-mini-2025-04-14``); later jobs fine-tune the
            previous job's model.
        n_iterations: Fine-tuning iterations.
        data_filter_ratio: Share of the rewarded rollouts kept as training examples, in (0, 1].
        max_deployments: Fine-tuned deployments of this loop kept at once (the oldest is deleted first).
        poll_interval: Seconds between status checks of files, jobs and deployments.
        rollout_timeout: Seconds to wait for a batch of rollouts.
        seed: Seed of the fine-tuning jobs.

    Raises:
        ValueError: An argument is out of range.
    """

    def __init__(
        self,
        config: AzureOpenAIConfig,
        *,
        base_deployment: str = "gpt-4.1-mini",
        base_model: str = "gpt-4.1-mini-2025-04-14",
        n_iterations: int = 3,
        data_filter_ratio: float = 0.5,
        max_deployments: int = 2,
        poll_interval: float = 30.0,
        rollout_timeout: float = 3600.0,
        seed: Optional[int] = 42,
    ) -> None:
        super().__init__()
        if n_iterations < 1 or max_deployments < 1:
            raise ValueError(f"n_iterations and max_deployments must be >= 1, got {n_iterations}, {max_deployments}")
        if not 0.0 < data_filter_ratio <= 1.0:
            raise ValueError(f"data_filter_ratio must be in (0, 1], got {data_filter_ratio}")
        self.config = config
        self.base_deployment = base_deployment
        self.base_model = base_model
        self.n_iterations = n_iterations
        self.data_filter_ratio = data_filter_ratio
        self.max_deployments = max_deployments
        self.poll_interval = poll_interval
        self.rollout_timeout = rollout_timeout
        self.seed = seed
        self.history: List[IterationRecord] = []

    async def _roll_out(self, tasks: Sequence[Any], deployment: str, mode: str) -> List[RolledOut]:
        store = self.get_store()
        llm = agl.LLM(endpoint=self.config.inference_base_url, model=deployment, api_key=self.config.api_key)
        resources = await store.update_resources(f"deployment-{deployment}", {"llm": llm})
        finished = await roll_out(
            store, tasks, resources_id=resources.resources_id, mode=mode, timeout=self.rollout_timeout
        )
        adapter = TraceToMessages()
        results = []
        for rollout in finished:
            conversations = adapter.adapt(rollout.spans) if rollout.succeeded else []
            results.append(RolledOut(rollout.reward, dict(conversations[-1]) if conversations else None))
        return results

    async def run(self, train_dataset: Optional[Any] = None, val_dataset: Optional[Any] = None) -> None:
        """Run ``n_iterations`` iterations; each one's record is appended to :attr:`history`."""
        if not train_dataset or not val_dataset:
            raise ValueError("AzureOpenAIFinetune needs a train_dataset and a val_dataset")
        azure = AzureOpenAIFineTuning(self.config, poll_interval=self.poll_interval)
        deployment, model = self.base_deployment, self.base_model
        ours: List[str] = []
        try:
            for iteration in range(1, self.n_iterations + 1):
                tag = f"[AOAI FT {iteration}/{self.n_iterations}]"
                rolled = await self._roll_out(list(train_dataset), deployment, "train")
                train_reward = sum(r.reward for r in rolled) / len(rolled)
                examples = select_examples(rolled, self.data_filter_ratio)
                logger.info("%s %d rollouts on %s, mean reward %.3f; %d examples kept.", tag, len(rolled),
                            deployment, train_reward, len(examples))  # fmt: skip
                if not examples:
                    raise AzureFineTuningError(f"{tag} no rewarded rollout to fine-tune on")
                file_id = await azure.upload_training_file(
                    fine_tune_jsonl(examples), f"agentbolt-ft-{iteration:02d}.jsonl"
                )
                model = await azure.fine_tune(model, file_id, suffix=f"agl-v{iteration:02d}", seed=self.seed)
                while len(ours) >= self.max_deployments:
                    await azure.delete_deployment(ours.pop(0))
                deployment = f"{self.base_deployment}-ft_v{iteration:02d}"
                await azure.deploy(deployment, model)
                ours.append(deployment)
                validation = await self._roll_out(list(val_dataset), deployment, "val")
                val_reward = sum(r.reward for r in validation) / len(validation)
                logger.info("%s %s on validation: mean reward %.3f.", tag, deployment, val_reward)
                self.history.append(
                    IterationRecord(iteration, train_reward, len(examples), file_id, model, deployment, val_reward)
                )
        finally:
            await azure.close()
