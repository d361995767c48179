"""Data-parallel GRPO updates over ``torch.distributed``: one leader rank, any number of follower ranks.

A run launched with ``torchrun --nproc_per_node N`` starts the same script N times. Rank 0, the *leader*, does
everything a one-process run does (store, runners, gateway, serving, rollouts, logging, checkpoints); ranks 1..N-1,
the *followers*, only take part in the policy updates:

1. At start-up every rank joins two process groups: the *update group* (NCCL when the trainer's device is a GPU,
   gloo on the CPU), which all-reduces gradients and metrics, and the *control group* (gloo), which carries Python
   objects from the leader. The leader sends its :class:`GRPOConfig`; the followers build their trainer from it,
   so the options that shape an update cannot differ between ranks.
2. Before the first update, the leader broadcasts its whole trainer state (every weight of the model and of the
   frozen reference, the optimizer and schedule state, the step counters and the minibatch shuffling generator),
   so the replicas start equal whatever each rank loaded or resumed.
3. For each update the leader broadcasts the step's samples (the packed batch is rebuilt on each rank from them;
   token ids are small next to activations). Every rank then runs the same :meth:`PolicyTrainer.train_step`: the
   minibatches are drawn identically everywhere, each minibatch is cut into micro-batches exactly as in one
   process, and rank ``r`` computes micro-batches ``r, r + N, r + 2N, ...`` of it.
4. Gradients are **summed** over ranks. Each micro-batch's loss is its token sum divided by ``N_mb``, the number of
   response tokens in the *whole minibatch* (every rank holds every sample, so every rank knows ``N_mb``): the sum
   over ranks is then exactly the one-process gradient, whatever the token counts of each rank's share. Averaging
   per-rank token means, as ``DistributedDataParallel`` does, would weigh a token by the inverse of its rank's token
   count instead, and differ from one process as soon as the shares are unequal.
5. Every rank clips the same summed gradient and steps the same optimizer, so parameters stay equal; metrics are
   summed (maxima taken) over ranks, so the leader reports the whole batch's.

With ``data_parallel="fsdp"`` the ranks do not hold replicas: :func:`shard_model` applies PyTorch's FSDP2
(``fully_shard``) to every transformer block and to the whole model, so each rank holds ``1/N`` of every parameter,
gradient and optimizer state. The micro-batches are dealt as above, but FSDP gathers each block's parameters in every
forward and reduce-scatters its gradients in every backward, collectives that every rank must call: a rank with fewer
micro-batches than another runs *idle passes* (a one-token batch whose loss is multiplied by zero) so that all ranks
run the same number of forwards and backwards. The gradient reduction is the same sum as above: FSDP's divide factor
is set to 1 and its collectives forced to ``SUM`` (otherwise it would reduce with ``PREMUL_SUM(1)``, which gloo
refuses: "Cannot use ReduceOp.PREMUL_SUM with Gloo"). The leader keeps a full, unsharded
copy of the policy for its engine and its checkpoints (:attr:`PolicyTrainer.served_model`), refreshed after every
update by gathering the trained parameters; checkpoints gather the optimizer state to the leader and keep the
replicated layout, so a run can resume in either mode.

A rank that dies breaks its peers' connections, and they fail at once with :class:`DistributedUpdateError`; one that
stalls fails them after ``distributed_timeout`` seconds. Followers wait for the leader's next batch (it may spend
many minutes rolling out) for up to :data:`LEADER_WAIT`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

import torch

if TYPE_CHECKING:
    from agentbolt.algorithm.grpo.config import GRPOConfig
    from agentbolt.algorithm.grpo.samples import TokenSample
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer

__all__ = [
    "DataParallel",
    "DistributedUpdateError",
    "LEADER_WAIT",
    "UpdateCommand",
    "check_data_parallel_config",
    "launched_rank",
    "shard_model",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

LEADER_WAIT = datetime.timedelta(hours=24)
"""How long a follower waits for the leader's next command (rollouts and validation happen meanwhile)."""

GRADIENT_BUCKET_ELEMENTS = 1 << 24
"""Gradients are all-reduced in flat buckets of at most this many elements (64 MiB in float32)."""


class DistributedUpdateError(RuntimeError):
    """A collective operation of a data-parallel update failed: another rank died, stalled past the timeout, or
    disagreed about what to do."""


def launched_rank() -> Tuple[int, int]:
    """``(rank, world_size)`` from the variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``); ``(0, 1)`` outside it.

    Raises:
        ValueError: The variables are malformed or inconsistent.
    """
    world_text, rank_text = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world_text is None:
        return 0, 1
    try:
        world, rank = int(world_text), int(rank_text if rank_text is not None else "0")
    except ValueError:
        raise ValueError(f"WORLD_SIZE={world_text!r} and RANK={rank_text!r} must be integers") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must lie in [0, WORLD_SIZE={world})")
    return rank, world


def check_data_parallel_config(config: GRPOConfig, world_size: int) -> None:
    """Refuse options under which some rank would never have a micro-batch to compute.

    The smallest minibatch of a full step holds ``rollouts_per_step // minibatches_per_epoch`` rollouts, hence at
    least that many samples and ``ceil(samples / micro_batch_size)`` micro-batches, dealt round-robin to the ranks.
    (At run time groups without signal are dropped, so a step may still leave a rank idle: it then adds a zero
    gradient, which is correct, only wasteful.)

    Raises:
        ValueError: ``world_size`` exceeds the micro-batches of the smallest minibatch; the message says what to change.
    """
    if world_size <= 1:
        return
    rollouts = config.rollouts_per_step // config.minibatches_per_epoch
    micro_batches = math.ceil(rollouts / config.micro_batch_size)
    if micro_batches >= world_size:
        return
    if rollouts < world_size:
        fix = (
            f"raise batch_size * group_size (now {config.batch_size} * {config.group_size}) or minibatch_size "
            f"(now {config.minibatch_size}) so that a minibatch holds at least {world_size} rollouts"
        )
    else:
        fix = f"set micro_batch_size to {rollouts // world_size} or less"
    raise ValueError(
        f"data-parallel training over {world_size} ranks needs at least {world_size} micro-batches per optimizer step, "
        f"but a minibatch of {rollouts} rollouts at micro_batch_size={config.micro_batch_size} makes only "
        f"{micro_batches}: {fix}"
    )


@dataclass
class UpdateCommand:
    """What the leader asks the followers to do next.

    Attributes:
        kind: ``"train_step"`` (with ``samples``), ``"skip_step"`` (advance the schedule only), ``"checkpoint"``
            (gather the sharded optimizer state to the leader) or ``"stop"``.
        samples: The step's samples, advantages set.
        share_state: The leader's trainer state follows this command (before the first update).
    """

    kind: Literal["train_step", "skip_step", "checkpoint", "stop"]
    samples: List[TokenSample] = field(default_factory=list)
    share_state: bool = False


@dataclass
class _ConfigMessage:
    """The leader's config, or why it refused to start (every rank then raises the same error)."""

    config: Optional[GRPOConfig]
    error: Optional[str]


@dataclass(eq=False, kw_only=True)
class DataParallel:
    """This process's place in a data-parallel GRPO run, and the collectives the update uses.

    Build it with :meth:`from_environment` in every process ``torchrun`` started. All collectives are called by every
    rank in the same order; the update runs them from :meth:`PolicyTrainer.train_step` on every rank.

    Args:
        rank: This process's rank (0 is the leader).
        world_size: Number of ranks.
        local_rank: Rank on this node (selects the GPU).
        device: The trainer's device on this rank.
        update_group: Process group of the gradient and metric all-reduces.
        control_group: gloo process group carrying the leader's objects.
        timeout: Seconds an update collective waits for the other ranks.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    update_group: Any
    control_group: Any
    timeout: float
    state_shared: bool = field(default=False, init=False)
    closed: bool = field(default=False, init=False)

    # ------------------------------------------------------------------------------------------------- set-up
    @classmethod
    def from_environment(cls, *, device: Optional[str], timeout: float) -> Optional[DataParallel]:
        """Join the process groups of the run ``torchrun`` launched (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``MASTER_ADDR``, ``MASTER_PORT``); None when this process runs alone.

        Args:
            device: The config's ``device``. None or ``"cuda"`` use GPU ``LOCAL_RANK`` when CUDA is available (NCCL),
                else the CPU (gloo); ``"cpu"`` forces gloo on the CPU.
            timeout: Seconds an update collective waits for the other ranks.

        Raises:
            ValueError: The launch variables are malformed, or ``device`` names one GPU (``"cuda:1"``) although
                each rank must use its own.
            DistributedUpdateError: The rendezvous with the other ranks failed.
        """
        rank, world_size = launched_rank()
        if world_size == 1:
            return None
        import torch.distributed as dist

        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        if device is not None and device.startswith("cuda:"):
            raise ValueError(
                f"device={device!r} names one GPU, but each data-parallel rank uses its own (cuda:LOCAL_RANK): "
                "set device='cuda' or leave it unset"
            )
        use_cuda = torch.cuda.is_available() and device in (None, "cuda")
        if use_cuda:
            torch.cuda.set_device(local_rank)
            resolved = torch.device("cuda", local_rank)
        else:
            from agentbolt.algorithm.finetuning.trainer import resolve_device

            resolved = resolve_device(device or "cpu")
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        with _failures("joining the process group", rank, world_size, timeout):
            if not dist.is_initialized():
                dist.init_process_group(
                    backend=backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout)
                )
            elif dist.get_world_size() != world_size:
                raise ValueError(
                    f"torch.distributed is initialised with {dist.get_world_size()} ranks but WORLD_SIZE={world_size}"
                )
            control = dist.new_group(backend="gloo", timeout=LEADER_WAIT)
        logger.info("Data-parallel rank %d of %d on %s (%s)", rank, world_size, resolved, backend)
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            device=resolved,
            update_group=dist.group.WORLD,
            control_group=control,
            timeout=timeout,
        )

    @property
    def is_leader(self) -> bool:
        """Whether this is rank 0, the one that runs the store, the rollouts and the logging."""
        return self.rank == 0

    def agree_on_config(self, config: GRPOConfig) -> GRPOConfig:
        """The leader's config, on every rank, once the leader checked it (:func:`check_data_parallel_config`).

        Raises:
            ValueError: The leader's config is refused; every rank raises the same message.
        """
        message = _ConfigMessage(config=None, error=None)
        if self.is_leader:
            try:
                check_data_parallel_config(config, self.world_size)
                message = _ConfigMessage(config=config, error=None)
            except ValueError as exc:
                message = _ConfigMessage(config=None, error=str(exc))
        received = self.broadcast_object(message, "sending the leader's config")
        if received.error is not None:
            self.close()  # a refused run is over on every rank
            raise ValueError(received.error)
        assert received.config is not None
        return received.config

    def close(self) -> None:
        """Leave the process groups (once; the leader first tells the followers to stop)."""
        if self.closed:
            return
        self.closed = True
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------------------------------- leader's commands
    def send(self, command: UpdateCommand) -> None:
        """Leader: broadcast ``command`` to the followers."""
        self.broadcast_object(command, f"sending {command.kind}")

    def receive(self) -> UpdateCommand:
        """Follower: the leader's next command (waits up to :data:`LEADER_WAIT`)."""
        return self.broadcast_object(None, "waiting for the leader's next command")

    def follow(self, trainer: PolicyTrainer) -> int:
        """Follower: run the leader's commands on ``trainer`` until it says stop; returns the updates taken part in.

        Raises:
            DistributedUpdateError: The leader or another rank died or stalled.
        """
        updates = 0
        while True:
            command = self.receive()
            if command.share_state:
                self.share_state(trainer)
            if command.kind == "stop":
                logger.info("Rank %d: the leader ended the run after %d updates", self.rank, updates)
                self.close()
                return updates
            if command.kind == "skip_step":
                trainer.skip_step()
            elif command.kind == "checkpoint":
                trainer.gather_optimizer_state()
            else:
                trainer.train_step(command.samples)
                updates += 1

    # ---------------------------------------------------------------------------------------------- collectives
    def shard(self, items: Sequence[T]) -> List[T]:
        """This rank's items: ``items[rank], items[rank + world_size], ...``."""
        return list(items[self.rank :: self.world_size])

    def share_state(self, trainer: PolicyTrainer) -> None:
        """Make every rank's trainer state the leader's: weights (model and reference), optimizer, schedule, step
        counters, minibatch generator.

        Raises:
            ValueError: The ranks hold models of different parameter names, shapes or dtypes.
        """
        import torch.distributed as dist

        if trainer.shards_model:
            trainer.load_leader_state()  # the shards take the leader's full weights (and resumed optimizer state)
        else:
            tensors = module_tensors(trainer.named_models())
            self.check_same_models(tensors)
            with self.failures("sharing the leader's weights"):
                for _, tensor in tensors:
                    dist.broadcast(tensor.data, src=0, group=self.update_group)
        state = {
            "optimizer": None if trainer.shards_model else trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "counters": (trainer.global_step, trainer.optimizer_steps, trainer.skipped_optimizer_steps),
            "generator": trainer.generator.get_state(),
        }
        state = self.broadcast_object(state if self.is_leader else None, "sharing the leader's optimizer state")
        if not self.is_leader:
            if state["optimizer"] is not None:
                trainer.optimizer.load_state_dict(state["optimizer"])
            trainer.scheduler.load_state_dict(state["scheduler"])
            trainer.global_step, trainer.optimizer_steps, trainer.skipped_optimizer_steps = state["counters"]
            trainer.generator.set_state(state["generator"])
        self.state_shared = True

    def check_same_models(self, tensors: Sequence[Tuple[str, torch.Tensor]]) -> None:
        """Compare the names, shapes and dtypes of ``tensors`` (this rank's model) over the ranks.

        Raises:
            ValueError: The ranks hold different models; every rank raises, naming the first difference.
        """
        layout = [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors]
        layouts = self._all_gather_object(layout, "comparing the ranks' models")
        for rank, other in enumerate(layouts):
            if other != layouts[0]:
                mismatch = next(
                    (f"{a} on rank 0, {b} on rank {rank}" for a, b in zip(layouts[0], other, strict=False) if a != b),
                    f"{len(layouts[0])} tensors on rank 0, {len(other)} on rank {rank}",
                )
                self.close()  # every rank refuses: the run is over
                raise ValueError(
                    f"the ranks loaded different models ({mismatch}): launch every rank with the same model"
                )

    def failures(self, what: str) -> ContextManager[None]:
        """Context turning a failed collective into a :class:`DistributedUpdateError` that says it was ``what``."""
        return _failures(what, self.rank, self.world_size, self.timeout)

    def sum_gradients(self, parameters: Sequence[torch.Tensor]) -> None:
        """Replace each parameter's gradient by its sum over ranks (a missing gradient counts as zeros)."""
        import torch.distributed as dist

        grads = []
        for param in parameters:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        with _failures("summing gradients", self.rank, self.world_size, self.timeout):
            for bucket in _buckets(grads):
                flat = torch.cat([g.reshape(-1) for g in bucket])
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.update_group)
                offset = 0
                for grad in bucket:
                    grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                    offset += grad.numel()

    def sum_values(self, values: Dict[str, float]) -> Dict[str, float]:
        """``values`` summed over ranks (every rank passes the same keys)."""
        return self._reduce_values(values, "sum")

    def max_values(self, values: Dict[str, float]) -> Dict[str, float]:
        """The maximum of ``values`` over ranks (every rank passes the same keys)."""
        return self._reduce_values(values, "max")

    def merge_per_sample(self, items: Sequence[Optional[T]]) -> List[Optional[T]]:
        """Merge per-sample values (CPU tensors...) that each rank filled for its own samples, None elsewhere."""
        gathered = self._all_gather_object(list(items), "gathering per-sample log-probs")
        merged: List[Optional[T]] = [None] * len(items)
        for part in gathered:
            for index, row in enumerate(part):
                if row is not None:
                    merged[index] = row
        return merged

    def _reduce_values(self, values: Dict[str, float], how: Literal["sum", "max"]) -> Dict[str, float]:
        import torch.distributed as dist

        keys = sorted(values)
        flat = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        op = dist.ReduceOp.SUM if how == "sum" else dist.ReduceOp.MAX
        with _failures(f"reducing metrics ({how})", self.rank, self.world_size, self.timeout):
            dist.all_reduce(flat, op=op, group=self.update_group)
        return dict(zip(keys, flat.tolist(), strict=True))

    def broadcast_object(self, value: Any, what: str) -> Any:
        """The leader's ``value`` (a picklable object) on every rank; ``what`` names it in errors."""
        import torch.distributed as dist

        box = [value]
        timeout = LEADER_WAIT.total_seconds()
        with _failures(what, self.rank, self.world_size, timeout):
            dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def _all_gather_object(self, value: Any, what: str) -> List[Any]:
        import torch.distributed as dist

        out: List[Any] = [None] * self.world_size
        with _failures(what, self.rank, self.world_size, self.timeout):
            dist.all_gather_object(out, value, group=self.update_group)
        return out


class ShardedForward(torch.nn.Module):
    """The root FSDP unit of a sharded model: calling it runs ``compute(model, *args)``.

    FSDP gathers a unit's parameters around the unit's ``forward``; the trainer runs the model's body and then its
    output projection as two calls (:func:`~agentbolt.serving.logits.float32_logits`), so the root unit is this
    wrapper, whose forward is the whole computation, rather than the model, whose forward is not called.

    Args:
        model: The model, whose transformer blocks are FSDP units of their own.
        compute: What a forward computes from the model and the call's arguments.
    """

    def __init__(self, model: torch.nn.Module, compute: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.compute = compute

    def forward(self, *args: Any) -> torch.Tensor:
        """``compute(model, *args)`` with every parameter of the model gathered where it is used."""
        return self.compute(self.model, *args)


def shard_model(
    model: torch.nn.Module, compute: Callable[..., torch.Tensor], device: torch.device, world_size: int
) -> ShardedForward:
    """Shard ``model`` in place over the ``world_size`` ranks of the default process group with FSDP2.

    Every transformer block (``_no_split_modules``) becomes an FSDP unit, gathered only while it computes; the rest
    (embeddings, final norm, output projection) forms the root unit, :class:`ShardedForward`. Parameters are
    resharded after each forward (and gathered again in the backward); gradients are **summed** over ranks (the
    trainer's loss already divides by the whole minibatch's token count, see the module docstring) with ``SUM``
    reduce-scatters, which gloo and NCCL both have (gloo lacks the ``PREMUL_SUM`` FSDP would otherwise use). FSDP moves each unit to ``device`` (``cuda:LOCAL_RANK`` or the CPU)
    as it shards it, so a model kept on the CPU until here never needs one device to hold all of it.

    Args:
        model: A transformers causal LM or a PEFT model around one.
        compute: The forward computation (see :class:`ShardedForward`).
        device: This rank's device.
        world_size: Number of ranks (the mesh is the default process group).

    Returns:
        The root unit: call it instead of ``compute(model, ...)``.

    Raises:
        ValueError: The model does not name its transformer blocks.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from agentbolt.algorithm.finetuning.trainer import transformer_blocks

    mesh = init_device_mesh(device.type, (world_size,))
    for block in transformer_blocks(model, "data_parallel='fsdp'"):
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    root = ShardedForward(model, compute)
    fully_shard(root, mesh=mesh, reshard_after_forward=True)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


def module_tensors(models: Sequence[Tuple[str, torch.nn.Module]]) -> List[Tuple[str, torch.Tensor]]:
    """Every tensor of the ``(prefix, module)`` pairs' state dicts, each storage once (tied weights appear once)."""
    seen = set()
    tensors: List[Tuple[str, torch.Tensor]] = []
    for prefix, model in models:
        for name, tensor in model.state_dict(keep_vars=True).items():
            key = (tensor.data_ptr(), tuple(tensor.shape))
            if key in seen:
                continue
            seen.add(key)
            tensors.append((prefix + name, tensor))
    return tensors


def _buckets(grads: Sequence[torch.Tensor]) -> Iterator[List[torch.Tensor]]:
    """Consecutive runs of same-dtype, same-device gradients of at most :data:`GRADIENT_BUCKET_ELEMENTS` elements."""
    bucket: List[torch.Tensor] = []
    size = 0
    for grad in grads:
        compatible = not bucket or (grad.dtype == bucket[0].dtype and grad.device == bucket[0].device)
        if bucket and (not compatible or size + grad.numel() > GRADIENT_BUCKET_ELEMENTS):
            yield bucket
            bucket, size = [], 0
        bucket.append(grad)
        size += grad.numel()
    if bucket:
        yield bucket


@contextlib.contextmanager
def _failures(what: str, rank: int, world_size: int, timeout: float) -> Iterator[None]:
    """Turn a failed collective into a :class:`DistributedUpdateError` that says what was happening and why."""
    try:
        yield
    except RuntimeError as exc:  # torch's DistBackendError and gloo's timeouts are RuntimeErrors
        if isinstance(exc, DistributedUpdateError):
            raise
        raise DistributedUpdateError(
            f"data-parallel GRPO: {what} failed on rank {rank} of {world_size}: {exc}. Another rank died (see its "
            f"log) or did not answer within {timeout:g} s."
        ) from exc
