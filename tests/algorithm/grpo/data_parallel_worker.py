"""One rank of a data-parallel GRPO update, run as its own process by test_data_parallel.py.

Usage: ``python data_parallel_worker.py RANK WORLD_SIZE PORT OUT_DIR CASE_JSON``. The rank joins the run the way
``torchrun`` would have it (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). The leader
(rank 0) makes the update on the case's samples; the followers run ``DataParallel.follow``. Each rank writes
``OUT_DIR/rank{N}.pt``: its trainable parameters and, on the leader, the update's metrics; or the error it raised.

Case keys: ``config`` (GRPOConfig fields), ``samples`` (how many), ``sample_seed``, ``model_seed`` (per rank: the
leader's state must win), ``follower`` (``"follow"``, ``"exit"``: die before the update, ``"stall"``: sleep through
it, ``"other_model"``: load a model of another shape), ``resume_from`` (a checkpoint the leader loads before the
update), ``checkpoint`` (a directory the leader checkpoints into after the update), ``tied`` (tied embeddings).

With ``config.data_parallel == "fsdp"`` each rank also writes ``shards`` (its local part of each trained parameter)
and ``held`` (elements of the trained model's parameters, of its trainable parameters and of the optimizer state this
rank holds), and the log-probs of 4 other samples it computes alone (``logprobs``, or ``logprobs_error``); the
leader's ``params`` are those of its full copy, the weights it serves and checkpoints.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    rank, world_size, port, out_dir, case_text = sys.argv[1:6]
    case = json.loads(case_text)
    os.environ.update(
        {
            "RANK": rank,
            "WORLD_SIZE": world_size,
            "LOCAL_RANK": rank,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
    )
    import torch

    torch.set_num_threads(1)
    from conftest import make_samples, tiny_llama
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentbolt.algorithm.grpo.config import GRPOConfig
    from agentbolt.algorithm.grpo.distributed import DataParallel
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer

    out = Path(out_dir) / f"rank{rank}.pt"
    leader = rank == "0"
    behaviour = "lead" if leader else case.get("follower", "follow")
    result: dict = {}
    try:
        config = GRPOConfig(**case["config"])
        data_parallel = DataParallel.from_environment(device="cpu", timeout=config.distributed_timeout)
        assert data_parallel is not None
        config = data_parallel.agree_on_config(config)
        if behaviour == "exit":
            os._exit(3)
        if behaviour == "other_model":
            model = LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=24,
                    hidden_size=16,
                    intermediate_size=32,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    num_key_value_heads=1,
                )
            )
        else:
            model = tiny_llama(seed=case.get("model_seed", [0] * 8)[int(rank)], tied=case.get("tied", False))
        trainer = PolicyTrainer(model, config, data_parallel=data_parallel)
        if behaviour == "stall":
            data_parallel.receive()
            time.sleep(60)
            return
        if leader:
            if case.get("resume_from"):
                trainer.load_checkpoint(case["resume_from"])
            samples = make_samples(case["samples"], seed=case.get("sample_seed", 0), model=tiny_llama(seed=0))
            result["metrics"] = trainer.train_step(samples)
            if case.get("checkpoint"):
                result["checkpoint"] = str(trainer.save_checkpoint(case["checkpoint"]))
        else:
            result["updates"] = data_parallel.follow(trainer)
        trained = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
        if trainer.shards_model:
            local = {name: p.to_local() for name, p in trainer.model.named_parameters()}
            result["shards"] = {name: local[name].detach().clone() for name in trained}
            state = [t for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
            result["held"] = {
                "params": sum(t.numel() for t in local.values()),
                "trainable": sum(local[name].numel() for name in trained),
                "optimizer": sum(t.to_local().numel() for t in state if t.dim() > 0),
            }
        full = dict(trainer.served_model.named_parameters())
        if leader or not trainer.shards_model:
            result["params"] = {name: full[name].detach().clone() for name in trained}
        if trainer.shards_model:  # scoring outside an update: the leader's full copy; a follower has none
            try:
                result["logprobs"] = trainer.compute_logprobs(make_samples(4, seed=9))
            except ValueError as exc:
                result["logprobs_error"] = str(exc)
        if leader:
            trainer.close()
    except Exception as exc:  # the test reads what each rank raised
        result = {"error_type": type(exc).__name__, "error": str(exc), "traceback": traceback.format_exc()}
    torch.save(result, out)


if __name__ == "__main__":
    main()
