"""Fine-tune the capital agent on Azure OpenAI: three fine-tune -> deploy -> evaluate iterations.

Needs an Azure OpenAI resource where fine-tuning is available, a base deployment, and (for deployments) an Azure AD
token: ``az login``, or ``AZURE_MANAGEMENT_TOKEN``. Configuration comes from the environment::

    export AZURE_OPENAI_ENDPOINT=https://RESOURCE.openai.azure.com AZURE_OPENAI_API_KEY=...
    export AZURE_SUBSCRIPTION_ID=... AZURE_RESOURCE_GROUP=... AZURE_OPENAI_RESOURCE_NAME=RESOURCE
    python -m examples.azure.train_capital_agent --base-deployment gpt-4.1-mini --base-model gpt-4.1-mini-2025-04-14
"""

from __future__ import annotations

import argparse
import logging
from typing import List, Optional

import httpx

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.azure.aoai_finetune import AzureFineTuningError, AzureOpenAIConfig, AzureOpenAIFinetune, management_token
from examples.azure.capital_agent import capital_agent, load_tasks
from examples.common.arguments import count, number
from examples.common.environment import CONFIGURATION_ERROR, reporting_refusals, require_reachable


def train(args: argparse.Namespace, config: AzureOpenAIConfig) -> AzureOpenAIFinetune:
    """Split the samples 80/20 and run the loop under a ``Trainer`` with ``args.n_runners`` runners."""
    tasks = load_tasks()
    cut = int(len(tasks) * 0.8)
    algorithm = AzureOpenAIFinetune(
        config,
        base_deployment=args.base_deployment,
        base_model=args.base_model,
        n_iterations=args.iterations,
        data_filter_ratio=args.data_filter_ratio,
        max_deployments=args.max_deployments,
        poll_interval=args.poll_interval,
    )
    trainer = agl.Trainer(algorithm=algorithm, n_runners=args.n_runners, port=pick_free_port("127.0.0.1"))
    trainer.fit(capital_agent, train_dataset=tasks[:cut], val_dataset=tasks[cut:])
    return algorithm


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.azure.train_capital_agent", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--base-deployment", default="gpt-4.1-mini", help="the deployment the first rollouts use")
    parser.add_argument("--base-model", default="gpt-4.1-mini-2025-04-14", help="the model the first job fine-tunes")
    parser.add_argument("--iterations", type=count(1), default=3, help="fine-tune -> deploy -> evaluate iterations")
    parser.add_argument(
        "--data-filter-ratio",
        type=number(above=0.0, maximum=1.0),
        default=0.5,
        help="share of the rewarded rollouts kept as training examples, in (0, 1]",
    )
    parser.add_argument(
        "--max-deployments", type=count(1), default=2, help="fine-tuned deployments of this loop kept at once"
    )
    parser.add_argument("--poll-interval", type=number(above=0.0), default=30.0, help="seconds between status checks")
    parser.add_argument("--n-runners", type=count(1), default=2, help="runner processes")
    args = parser.parse_args(argv)
    agl.setup_logging("INFO")
    try:
        config = AzureOpenAIConfig.from_env()
    except ValueError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: {exc}\n")
    require_reachable(
        parser,
        f"{config.inference_base_url}/models",
        service="the Azure OpenAI resource",
        configure="set AZURE_OPENAI_ENDPOINT to the resource's endpoint (https://RESOURCE.openai.azure.com)",
    )
    try:  # before a fine-tuning job is paid for: deploying its model needs the token
        management_token(config)
    except AzureFineTuningError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: {exc}\n")
    with reporting_refusals(
        parser,
        service="Azure OpenAI",
        configure="check AZURE_OPENAI_API_KEY, the deployments named and the resource's fine-tuning quota",
    ):
        try:
            algorithm = train(args, config)
        except AzureFineTuningError as exc:  # a job or deployment failed on Azure's side: the run cannot go on
            parser.exit(1, f"error: {exc}\n")
        except httpx.HTTPError as exc:
            parser.exit(1, f"error: lost the connection to Azure mid-run ({type(exc).__name__}: {exc})\n")
    for record in algorithm.history:
        logging.getLogger(__name__).info("%s", record)
        print(f"iteration {record.iteration}: {record.deployment} ({record.model}), train reward "
              f"{record.train_reward:.3f}, {record.examples} examples, validation reward {record.val_reward:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
