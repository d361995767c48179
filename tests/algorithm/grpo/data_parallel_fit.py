"""The toy task of test_end_to_end.py trained through ``Trainer.fit`` under ``torchrun`` (run by test_data_parallel.py).

Usage: ``torchrun --nproc_per_node 2 data_parallel_fit.py OUT_DIR [STEPS [DATA_PARALLEL]]`` (``DATA_PARALLEL``:
``replicate``, the default, or ``fsdp``). Every rank runs this same script, as users'
scripts do: rank 0's ``Trainer.fit`` runs the store, the runner, the gateway, the engine and GRPO; the other ranks'
``Trainer.fit`` only take part in the updates. Rank 0 writes ``OUT_DIR/history.json``; every rank writes
``OUT_DIR/rank{N}.done`` when ``fit`` returns; the last step's checkpoint goes to ``OUT_DIR/checkpoints``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for support.word_model

from support.word_model import PingAgent, build_word_model, fit

from agentbolt.algorithm.grpo.algorithm import GRPO

TASKS = [{"prompt": "ping", "answer": "yes"}]


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    model_dir = out / "word-llama"
    if rank == 0:
        build_word_model(model_dir)  # the follower loads it once the leader's config arrives
    algorithm = GRPO(
        model=str(model_dir),
        served_model_name="word-llama",
        finetune="full",
        batch_size=1,
        group_size=16,
        max_steps=int(sys.argv[2]) if len(sys.argv) > 2 else 6,
        learning_rate=2e-2,
        micro_batch_size=4,
        val_before_train=False,
        log_dir=str(out / "logs"),
        console=False,
        rollout_timeout=120,
        distributed_timeout=60,
        seed=0,
        data_parallel=sys.argv[3] if len(sys.argv) > 3 else "replicate",
        checkpoint_dir=str(out / "checkpoints"),
    )
    fit(algorithm, PingAgent(), train=TASKS)
    if rank == 0:
        (out / "history.json").write_text(json.dumps(algorithm.history), encoding="utf-8")
    (out / f"rank{rank}.done").write_text("ok", encoding="utf-8")


if __name__ == "__main__":
    main()
