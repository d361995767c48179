"""The SFT algorithm as its own process, against a store server that runner processes also use.

Three terminals, from the repository root (the reference example's layout)::

    agentbolt store --port 4747 --path runs/sft/store.db
    python -m examples.sft.runners --store http://127.0.0.1:4747 --runners 8
    python -m examples.sft.algorithm --store http://127.0.0.1:4747

The algorithm serves the model being trained in this process, routes it through its own LLM gateway, enqueues
rollouts in the store and trains on what the runners record; it stops after ``max_steps`` and prints the summary
(the runners keep waiting for work until stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import List, Optional

from examples.common.arguments import count
from examples.common.environment import CONFIGURATION_ERROR
from examples.sft.data import load_split
from examples.sft.settings import CONFIG_FILE, run_options

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Run SFT against the store at ``--store``; prints the summary as JSON."""
    parser = argparse.ArgumentParser(prog="python -m examples.sft.algorithm", description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="URL of the store server, e.g. http://127.0.0.1:4747")
    parser.add_argument("--config", type=Path, default=CONFIG_FILE, help="Config file whose options are used.")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="Override an option.")
    parser.add_argument("--n-val", type=count(1), default=None, help="Held-out problems (default: all 200).")
    parser.add_argument("--verbose", "-v", action="store_true", help="Show library logs.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        options, _ = run_options(args.config, args.option)
    except ValueError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: {exc}\n")

    from agentbolt.serving.transformers_engine import configure_openmp

    configure_openmp()
    import agentbolt as agl
    from examples.sft.allinone import summarize

    started = time.perf_counter()
    algorithm = agl.SFT(**options)
    store = agl.LightningStoreClient(args.store)
    algorithm.set_store(store)
    val = load_split("val")

    async def train() -> None:
        try:
            await algorithm.run(train_dataset=load_split("train"), val_dataset=val[: args.n_val])
        finally:
            await store.close()

    try:
        asyncio.run(train())
    except ValueError as exc:  # what SFT.run refuses before it trains: a log_dir holding another run's metrics...
        parser.exit(CONFIGURATION_ERROR, f"error: {exc}\n")
    run_dir = Path(options.get("log_dir") or ".")
    print(json.dumps(summarize(algorithm.history, time.perf_counter() - started, run_dir), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
