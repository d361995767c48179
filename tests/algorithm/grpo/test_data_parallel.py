"""Data-parallel GRPO updates: 2 CPU ranks (gloo on 127.0.0.1) against one process on the same batch.

Each rank is a real process (``data_parallel_worker.py``) joining the run through the variables ``torchrun`` sets.
The follower starts from other random weights than the leader, so equal results also show that the leader's state
reaches it before the first update.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch
from conftest import make_samples, tiny_llama
from support.servers import free_port

from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.distributed import check_data_parallel_config, launched_rank
from agentbolt.algorithm.grpo.trainer import PolicyTrainer

WORKER = Path(__file__).resolve().parent / "data_parallel_worker.py"


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    """One torch thread, as in the workers (the same float summation order), and no second thread to wait for on
    busy cores. Overrides the GRPO tests' two-thread fixture of the same name."""
    torch.set_num_threads(1)


BASE = {"learning_rate": 1e-2, "max_grad_norm": 1.0, "batch_size": 2, "group_size": 4, "seed": 3}


def _run_ranks(tmp_path: Path, case: Dict[str, Any], world_size: int = 2, timeout: float = 600) -> List[Dict]:
    """Start one worker process per rank and return what each wrote (params and metrics, or its error)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(world_size), str(port), str(tmp_path), json.dumps(case)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world_size)
    ]
    try:
        procs[0].wait(timeout=timeout)  # the leader decides the outcome; a stalled follower is killed below
        for proc in procs[1:]:
            proc.wait(timeout=timeout if case.get("follower", "follow") == "follow" else 10)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for rank, proc in enumerate(procs):
        out = tmp_path / f"rank{rank}.pt"
        log = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        results.append(
            torch.load(out, weights_only=False) if out.exists() else {"exit_code": proc.returncode, "log": log}
        )
    return results


def _one_process(case: Dict[str, Any], checkpoint_dir: Optional[Path] = None) -> Dict[str, Any]:
    trainer = PolicyTrainer(tiny_llama(seed=0, tied=case.get("tied", False)), GRPOConfig(**case["config"]))
    samples = make_samples(case["samples"], seed=case.get("sample_seed", 0), model=tiny_llama(seed=0))
    metrics = trainer.train_step(samples)
    checkpoint = trainer.save_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    logprobs = trainer.compute_logprobs(make_samples(4, seed=9))
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    state = [t for s in trainer.optimizer.state.values() for t in s.values() if t.dim() > 0]
    held = {
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "trainable": sum(p.numel() for p in params.values()),
        "optimizer": sum(t.numel() for t in state),
    }
    return {"metrics": metrics, "params": params, "held": held, "checkpoint": checkpoint, "logprobs": logprobs}


def _assert_same_params(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


SHARDED_ATOL = 1e-5
"""FSDP sums gradients in another order than one process; AdamW divides each gradient by its running RMS, so an
element whose gradient is near zero can carry that rounding into its update. 1e-5 is a thousandth of one step at
the tests' learning rate of 1e-2."""


CASES = {
    # 8 samples of 1-5 response tokens, micro-batches of 3: 3 micro-batches, rank 0 computes two, rank 1 one, and
    # their response-token counts differ, so only the whole-minibatch normaliser gives the one-process gradient.
    "lora_odd_micro_batches_unequal_tokens": {"config": {**BASE, "micro_batch_size": 3}, "samples": 8},
    # Full fine-tuning, two minibatches per epoch and two epochs (a sharded scoring pass for the old log-probs),
    # the k3 KL to a frozen reference (sharded reference pass), one sample per micro-batch (odd counts per rank).
    "full_two_epochs_minibatches_kl": {
        "config": {
            **BASE,
            "finetune": "full",
            "micro_batch_size": 1,
            "ppo_epochs": 2,
            "minibatch_size": 4,
            "kl_coef": 0.1,
            "pack_shared_prefixes": False,
        },
        "samples": 8,
        "sample_seed": 1,
    },
}


def _assert_same_metrics(ranks: Dict[str, Any], alone: Dict[str, Any]) -> None:
    for key in (
        "loss",
        "pg_loss",
        "kl",
        "entropy",
        "ratio_mean",
        "clip_fraction",
        "grad_norm",
        "first_minibatch_ratio_max_dev",
    ):
        assert ranks[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
    for key in ("optimizer_steps", "samples", "response_tokens", "forward_tokens", "logprob_engine_diff_max"):
        assert ranks[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_ranks_equal_one_process_after_an_update(tmp_path: Path, name: str) -> None:
    case = {**CASES[name], "model_seed": [0, 7]}  # the follower starts from other weights: the leader's must win
    leader, follower = _run_ranks(tmp_path, case)
    assert "error" not in leader and "error" not in follower, (leader, follower)
    alone = _one_process(case)
    _assert_same_params(leader["params"], alone["params"])
    _assert_same_params(follower["params"], leader["params"])
    assert follower["updates"] == 1
    _assert_same_metrics(leader["metrics"], alone["metrics"])


def _fsdp(case: Dict[str, Any]) -> Dict[str, Any]:
    """``case`` sharded. Full fine-tuning also ties the embeddings (one parameter used by the first and the root
    unit's last computation) and recomputes its blocks in the backward, inside FSDP's units; LoRA adds the KL term,
    whose reference pass (the sharded base, adapters off) deals 3 micro-batches to 2 ranks: one idle pass without
    gradients, as the update has one with."""
    full = case["config"].get("finetune") == "full"
    config = {**case["config"], "data_parallel": "fsdp", "gradient_checkpointing": full}
    if not full:
        config["kl_coef"] = 0.1
    return {**case, "tied": full, "config": config}


def _assert_shards_of(results: List[Dict[str, Any]], params: Dict[str, torch.Tensor]) -> None:
    """Each rank's local part of every trained parameter is its dim-0 chunk of ``params`` (FSDP's layout)."""
    for rank, result in enumerate(results):
        assert result["shards"].keys() == params.keys()
        for name, shard in result["shards"].items():
            expected = params[name].chunk(len(results), dim=0)[rank]
            torch.testing.assert_close(shard, expected, rtol=1e-5, atol=SHARDED_ATOL, msg=f"rank {rank}: {name}")


def _checkpoint_tensors(path: Path, finetune: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights = path / "adapter" / "adapter_model.safetensors" if finetune == "lora" else path / "model.safetensors"
    tensors = load_file(str(weights))
    optimizer = torch.load(path / "optimizer.pt", weights_only=True)
    for index, state in optimizer["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"optimizer.{index}.{key}"] = state[key]
    return tensors


# The LoRA case runs with the slow tests: the default suite shards LoRA in the resume test below, and this full
# fine-tuning case adds what only the sharded equality shows (tied embeddings, recomputed blocks, two epochs).
FSDP_CASES = [pytest.param(name, marks=pytest.mark.slow) if name.startswith("lora") else name for name in sorted(CASES)]


@pytest.mark.parametrize("name", FSDP_CASES)
def test_fsdp_two_ranks_equal_one_process_and_each_holds_half(tmp_path: Path, name: str) -> None:
    """Sharded over 2 ranks: the leader's full copy (what it serves and scores with alone) and its checkpoint
    (weights and optimizer state) equal one process's, every rank's shards are their chunks, and each rank holds
    half of the parameters, the trainable ones and the optimizer state that one process (or a replicating rank)
    holds."""
    case = {**_fsdp(CASES[name]), "model_seed": [0, 7], "checkpoint": str(tmp_path / "sharded")}
    leader, follower = _run_ranks(tmp_path, case)
    assert "error" not in leader and "error" not in follower, (leader, follower)
    alone = _one_process(case, tmp_path / "alone")
    _assert_same_params(leader["params"], alone["params"], atol=SHARDED_ATOL)
    finetune = case["config"].get("finetune", "lora")
    written, expected = (_checkpoint_tensors(p, finetune) for p in (Path(leader["checkpoint"]), alone["checkpoint"]))
    assert written.keys() == expected.keys()
    _assert_same_params(written, expected, atol=SHARDED_ATOL)
    _assert_shards_of([leader, follower], alone["params"])
    for mine, expected in zip(leader["logprobs"], alone["logprobs"], strict=True):
        torch.testing.assert_close(mine, expected, rtol=1e-4, atol=1e-5)
    assert "computed on the leader from its full copy" in follower["logprobs_error"]
    assert follower["updates"] == 1
    _assert_same_metrics(leader["metrics"], alone["metrics"])
    for key, replicated in alone["held"].items():
        held = [leader["held"][key], follower["held"][key]]
        assert sum(held) == replicated, key  # the shards partition the model: nothing is held twice
        assert max(held) <= 0.55 * replicated, (key, held, replicated)


def test_a_follower_that_dies_fails_the_update_with_a_clear_error(tmp_path: Path) -> None:
    case = {"config": {**BASE, "micro_batch_size": 2, "distributed_timeout": 30}, "samples": 8, "follower": "exit"}
    leader, follower = _run_ranks(tmp_path, case)
    assert follower["exit_code"] == 3
    assert leader["error_type"] == "DistributedUpdateError", leader
    assert "rank 0 of 2" in leader["error"] and "Another rank died" in leader["error"]


def test_a_stalled_follower_fails_the_update_after_the_timeout(tmp_path: Path) -> None:
    case = {"config": {**BASE, "micro_batch_size": 2, "distributed_timeout": 3}, "samples": 8, "follower": "stall"}
    leader, _ = _run_ranks(tmp_path, case)
    assert leader["error_type"] == "DistributedUpdateError", leader
    assert "did not answer within 3 s" in leader["error"]


@pytest.mark.parametrize("data_parallel", ["replicate", "fsdp"])
def test_ranks_with_different_models_are_refused_on_every_rank(tmp_path: Path, data_parallel: str) -> None:
    config = {**BASE, "micro_batch_size": 2, "data_parallel": data_parallel}
    case = {"config": config, "samples": 8, "follower": "other_model"}
    leader, follower = _run_ranks(tmp_path, case)
    for result in (leader, follower):
        assert result["error_type"] == "ValueError", result
        assert "the ranks loaded different models" in result["error"]


def test_a_config_leaving_a_rank_without_work_is_refused_on_every_rank(tmp_path: Path) -> None:
    # 8 rollouts per minibatch at micro_batch_size 8: one micro-batch for two ranks.
    case = {"config": {**BASE, "micro_batch_size": 8}, "samples": 8}
    leader, follower = _run_ranks(tmp_path, case)
    for result in (leader, follower):
        assert result["error_type"] == "ValueError", result
        assert "set micro_batch_size to 4 or less" in result["error"]


def test_world_size_beyond_the_rollouts_of_a_minibatch_names_the_fix() -> None:
    config = GRPOConfig(batch_size=1, group_size=2, micro_batch_size=1)
    check_data_parallel_config(config, 2)  # two rollouts, one each
    with pytest.raises(
        ValueError, match=r"over 4 ranks .* a minibatch of 2 rollouts .* raise batch_size \* group_size"
    ):
        check_data_parallel_config(config, 4)


def test_fsdp_on_a_device_it_cannot_shard_over_is_refused_before_any_model_loads() -> None:
    with pytest.raises(ValueError, match=r"data_parallel='fsdp' shards over CPU \(gloo\) or CUDA \(NCCL\) ranks, not "):
        GRPOConfig(data_parallel="fsdp", device="mps")
    with pytest.raises(ValueError, match="data_parallel"):
        GRPOConfig(data_parallel="zero3")
    assert GRPOConfig(data_parallel="fsdp", device="cuda").data_parallel == "fsdp"


def test_fsdp_alone_trains_like_replicate() -> None:
    """Without torchrun there is nothing to shard over: the option changes nothing."""
    samples = make_samples(8, model=tiny_llama(seed=0))
    params = []
    for mode in ("replicate", "fsdp"):
        trainer = PolicyTrainer(tiny_llama(seed=0), GRPOConfig(**BASE, micro_batch_size=3, data_parallel=mode))
        assert not trainer.shards_model and trainer.served_model is trainer.model
        trainer.train_step(samples)
        params.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
    _assert_same_params(params[0], params[1])


def test_launch_variables_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert launched_rank() == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"RANK=2 must lie in \[0, WORLD_SIZE=2\)"):
        launched_rank()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="must be integers"):
        launched_rank()


def test_one_gpu_for_every_rank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbolt.algorithm.grpo.distributed import DataParallel

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match=r"device='cuda:1' names one GPU"):
        DataParallel.from_environment(device="cuda:1", timeout=10)


def test_follow_on_rank_zero_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbolt.algorithm.grpo.algorithm import GRPO

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="this process is rank 0 of 2"):
        GRPO().follow()


@pytest.mark.slow
@pytest.mark.parametrize("data_parallel", ["replicate", "fsdp"])
def test_torchrun_trains_the_toy_task_through_trainer_fit(tmp_path: Path, data_parallel: str) -> None:
    """``torchrun --nproc_per_node 2`` on a script calling ``Trainer.fit``: rank 0 runs the whole stack, rank 1 only
    the updates; the policy learns as in one process (sharded or not: sharded, the leader's engine serves its full
    copy), both ranks end when the run ends, and the leader writes the last step's checkpoint."""
    script = Path(__file__).resolve().parent / "data_parallel_fit.py"
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        str(script),
        str(tmp_path),
        "8",
        data_parallel,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "rank0.done").exists() and (tmp_path / "rank1.done").exists()
    assert (tmp_path / "checkpoints" / "step_000008" / "model.safetensors").exists()
    history = json.loads((tmp_path / "history.json").read_text())
    train = [r for r in history if "train/reward_mean" in r]
    assert len(train) == 8
    assert any("update/loss" in r for r in train)
    first = sum(r["train/reward_mean"] for r in train[:2]) / 2
    last = sum(r["train/reward_mean"] for r in train[-2:]) / 2
    assert first < 0.35 and last > first + 0.3, [r["train/reward_mean"] for r in train]


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_fsdp_resumes_a_checkpoint_into_the_shards(tmp_path: Path, finetune: str) -> None:
    """A sharded run resumed on the leader from a checkpoint (the same whichever mode wrote it, see above) takes its
    next step exactly as the one process that wrote it: the shards take the checkpoint's weights and AdamW state."""
    config = {**BASE, "micro_batch_size": 3, "finetune": finetune}
    alone = PolicyTrainer(tiny_llama(seed=0), GRPOConfig(**config))
    alone.train_step(make_samples(8, seed=0, model=tiny_llama(seed=0)))
    checkpoint = alone.save_checkpoint(tmp_path / "alone")
    alone.train_step(make_samples(8, seed=5, model=tiny_llama(seed=0)))
    second = {n: p.detach().clone() for n, p in alone.model.named_parameters() if p.requires_grad}

    config = {**config, "data_parallel": "fsdp"}
    case = {"config": config, "samples": 8, "sample_seed": 5, "resume_from": str(checkpoint), "model_seed": [0, 7]}
    leader, follower = _run_ranks(tmp_path, case)
    assert "error" not in leader and "error" not in follower, (leader, follower)
    assert leader["metrics"]["optimizer_steps"] == 2
    _assert_same_params(leader["params"], second, atol=SHARDED_ATOL)
    _assert_shards_of([leader, follower], second)
