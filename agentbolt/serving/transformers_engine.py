"""In-process inference engine on Hugging Face transformers with continuous batching.

One scheduler thread owns the model while generating. Each loop iteration it

1. admits waiting requests (up to ``max_batch_size`` running sequences): their prompts are prefilled together,
   left padded, starting from the cached states of prompt prefixes computed before (:mod:`.prefix_cache`), and
   their key/value caches are merged into the running batch (also left padded);
2. runs one decoding step for every running sequence;
3. samples the next token of each sequence with its own generator, records its log-probability, checks EOS,
   stop tokens, stop strings and length, releases text to the request, and drops finished sequences from the
   batch (and the padding columns nobody needs any more).

Log-probabilities are those of the *untempered* model distribution: ``log_softmax(logits)`` of the exact logits
the token was sampled from, before temperature and top-p are applied (vLLM's default). Logits are float32 whatever
the model's dtype (output projection in float32, :mod:`agentbolt.serving.logits`); a trainer computing them the same
way gets the same numbers up to the rounding of the model's dtype (the GRPO trainer does, and reports the gap).

Sharing the model with a trainer: :meth:`TransformersEngine.from_model` wraps an existing model object, so
weights updated in place are used by the next decoding step without a copy. Run every in-place update inside
:meth:`TransformersEngine.weights_update`; it waits for the current step to end, blocks new steps while held,
and increments :attr:`TransformersEngine.weight_version`. LoRA adapters (PEFT) are loaded, unloaded and
selected per request; a running batch only contains sequences of one adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncGenerator,
    Callable,
    Deque,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from agentbolt.serving.chat_prompt import ChatPromptEncoder, check_unicode
from agentbolt.serving.fast_forward import BlockModel
from agentbolt.serving.guided import RegexGuide, TokenTexts, guided_row
from agentbolt.serving.kv_cache import KVCache
from agentbolt.serving.params import (
    AdapterNotLoadedError,
    ContextOverflowError,
    EngineError,
    EngineOverloadedError,
    GenerationFailedError,
    GenerationOutput,
    SamplingParams,
    SequenceDelta,
    SequenceOutput,
)
from agentbolt.serving.prefix_cache import CachedBlock, PrefixCache
from agentbolt.utils.imports import peft_wrapping

if TYPE_CHECKING:
    import torch

    from agentbolt.serving.fast_forward import FastForward
    from agentbolt.serving.quantized import BlockWeights

__all__ = ["OPENMP_WAIT_POLICIES", "TransformersEngine", "configure_openmp", "resolve_dtype"]

logger = logging.getLogger(__name__)

_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32", "float16": "float16"}
_DTYPES.update({"fp16": "float16", "half": "float16", "float": "float32"})


def resolve_dtype(name: str) -> torch.dtype:
    """Map a dtype name (``bfloat16``/``bf16``, ``float32``/``fp32``, ``float16``/``fp16``) to a torch dtype.

    Raises:
        EngineError: Unknown name.
    """
    import torch

    key = _DTYPES.get(name.lower())
    if key is None:
        raise EngineError(f"unknown dtype {name!r}; use one of bfloat16, float32, float16")
    return getattr(torch, key)


def check_device(name: str) -> None:
    """Check that ``name`` is a torch device (``cpu``, ``cuda``, ``cuda:1``, ``mps``...) this machine has.

    Raises:
        EngineError: Not a device name, or a device this machine does not have.
    """
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise EngineError(f"unknown device {name!r}: use cpu, cuda, cuda:1, mps...") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {name!r}: this machine has no CUDA device (torch sees none); use cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise EngineError(f"device {name!r}: there are {torch.cuda.device_count()} CUDA devices")


OPENMP_WAIT_POLICIES = ("passive", "spin")
_OPENMP_CHECKED = False


def configure_openmp(policy: str = "passive") -> None:
    """Choose how torch's idle OpenMP threads wait for work, if it is still possible (before torch is imported).

    Every parallel operator ends at a barrier where finished threads wait for the others, and a forward pass runs
    a few hundred of them. Two policies, measured on a 2-core VM decoding the embedded model (batch 8, bfloat16,
    2 threads; docs/serving.md has the table):

    * ``"passive"`` (``OMP_WAIT_POLICY=PASSIVE``): waiting threads sleep at once. Safe when other work shares the
      cores (a trainer in the same process, runners, another server): about 190 tokens/s both on an idle machine
      and next to a busy low-priority process. The default, and what training jobs use.
    * ``"spin"`` (``GOMP_SPINCOUNT=10000``): waiting threads spin briefly before sleeping, so consecutive operators
      start without a wake-up. About 1.7x faster (310 tokens/s) when the process has the cores to itself, and
      several times slower when anything else runs on them. ``agentbolt serve`` uses it by default
      (``--omp-wait passive`` to change).

    An explicit ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in the environment always wins. Once torch is imported
    the variables are no longer read: a warning says how to set them instead.

    Raises:
        ValueError: Unknown policy.
    """
    global _OPENMP_CHECKED
    if policy not in OPENMP_WAIT_POLICIES:
        raise ValueError(f"unknown OpenMP wait policy {policy!r}; use one of {', '.join(OPENMP_WAIT_POLICIES)}")
    if _OPENMP_CHECKED:
        return
    _OPENMP_CHECKED = True
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    variable, value = ("OMP_WAIT_POLICY", "PASSIVE") if policy == "passive" else ("GOMP_SPINCOUNT", "10000")
    if "torch" not in sys.modules:
        os.environ[variable] = value
        return
    logger.warning(
        "torch was imported before the inference engine chose its OpenMP wait policy: with torch's default, idle "
        "threads spin for a long time, which can slow generation many times when threads or processes share the "
        "CPUs. Set %s=%s in the environment before importing torch.",
        variable,
        value,
    )


def _base_model(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper (or ``model`` itself)."""
    return model.get_base_model() if getattr(model, "peft_config", None) else model


@dataclass(eq=False)
class _Request:
    """A submitted request and its channel back to the caller.

    ``cancelled`` is set by the caller (it stopped listening) or by the engine (the request failed or finished);
    a cancelled request's sequences leave the batch at the next step.
    """

    prompt: List[int]
    params: SamplingParams
    adapter: Optional[str]
    emit: Callable[[List[SequenceDelta]], object]
    fail: Callable[[BaseException], object]
    cancelled: bool = field(default=False, init=False)
    remaining: int = field(init=False)
    guide: Optional[RegexGuide] = field(default=None, init=False)
    weight_version: int = field(default=0, init=False)
    # Queued tokens it holds (see TransformersEngine.request_cost) until released.
    cost: int = field(default=0, init=False)
    released: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        self.remaining = self.params.n


@dataclass
class _Sequence:
    request: _Request
    index: int
    max_tokens: int
    generator: torch.Generator
    token_ids: List[int] = field(default_factory=list)
    text: str = ""
    released: int = 0
    finished: bool = False
    # Incremental detokenization: token_ids[prefix_offset:read_offset] is context already turned into text.
    prefix_offset: int = 0
    read_offset: int = 0


def _transformers_config(path: Path) -> Any:
    """The model's config as transformers reads it."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


_FAST_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def _block_model_tokenizer(path: Path) -> Any:
    """The model's tokenizer loaded as the ``tokenizers``-backed class its config names, or ``None`` for any other class.

    ``AutoTokenizer`` would load the same class, but it first imports transformers' config classes and, with them,
    most of the library, which a :class:`~agentbolt.serving.fast_forward.BlockModel` exists to avoid.
    """
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if config.get("tokenizer_class") not in _FAST_TOKENIZER_CLASSES or not (path / "tokenizer.json").is_file():
        return None
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path)


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-size:]):
                longest = size
                break
    return longest


class TransformersEngine:
    """Continuous-batching text generation on a transformers causal LM (see the module docstring).

    Args:
        model: Model directory, registry name or hub id (resolved with :func:`agentbolt.models.resolve_model`).
        dtype: Compute dtype; ``bfloat16`` (default) is the faster choice on recent CPUs and on GPUs.
        device: ``cpu``, ``cuda``, ``cuda:1``...; default CUDA when available, else CPU.
        threads: ``torch.set_num_threads`` value (CPU); default leaves torch's choice.
        max_batch_size: Maximum sequences decoded together (a request with ``n`` choices counts ``n``).
        max_model_len: Context length; default the model's ``max_position_embeddings``.
        served_name: Name reported by ``/v1/models`` (default: the ``model`` argument).
        fast_forward: Use the lean CPU forward of :mod:`agentbolt.serving.fast_forward` for the models it covers
            (Llama-architecture, no PEFT adapter, CPU); ``False`` always runs the transformers forward.
        max_queued_tokens: Most tokens of work (:meth:`request_cost`) held by waiting and running requests at once;
            a request that would pass it is refused with :class:`EngineOverloadedError`. ``None``: no bound.
        quantization: Weights to serve (CPU, lean forward; see :mod:`agentbolt.serving.quantized`): ``none`` the
            float weights in ``dtype``; ``auto`` the model's own GGUF blocks when it was converted from a GGUF file
            (the same numbers as its float32 weights), else ``none``; ``q8_0`` / ``q4_1`` every projection in that
            block format (quantized at load where the file does not already hold it: lossy). Block weights compute
            with float32 activations and refuse weight updates and LoRA adapters: they are for plain serving,
            never for training.
        int8_activations: With block weights: quantize each product's inputs to int8 per block of 32 and multiply
            in integers, as llama.cpp does (faster on one stream; logits no longer equal the float32 model's, see
            docs/serving.md). Needs block weights: an error with ``quantization='none'`` or when ``auto`` finds
            none.
        prefix_cache_mb: Memory for the key/value states of prompt prefixes reused by later prompts that start the
            same (:mod:`agentbolt.serving.prefix_cache`); 0 disables the cache.
    """

    def __init__(
        self,
        model: Union[str, os.PathLike[str]],
        *,
        dtype: str = "bfloat16",
        device: Optional[str] = None,
        threads: Optional[int] = None,
        max_batch_size: int = 8,
        max_model_len: Optional[int] = None,
        served_name: Optional[str] = None,
        fast_forward: bool = True,
        max_queued_tokens: Optional[int] = None,
        quantization: str = "none",
        prefix_cache_mb: int = 256,
        int8_activations: bool = False,
    ) -> None:
        from agentbolt.serving.quantized import QUANTIZATIONS

        if quantization not in QUANTIZATIONS:
            raise EngineError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
        if int8_activations and quantization == "none":
            raise EngineError("int8 activations need block weights: use quantization 'auto', 'q8_0' or 'q4_1'")
        if max_queued_tokens is not None and max_queued_tokens < 1:
            raise EngineError(f"max_queued_tokens must be at least 1, got {max_queued_tokens}")
        if max_batch_size < 1:
            raise EngineError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if threads is not None and threads < 1:
            raise EngineError(f"threads must be at least 1, got {threads}")
        configure_openmp()
        self.model_ref = os.fspath(model)
        self.served_name = served_name or self.model_ref
        self.dtype_name = dtype
        self.device_name = device
        self.threads = threads
        self.max_batch_size = max_batch_size
        self._max_model_len_override = max_model_len
        self.model: Any = None
        self.device: Any = None  # torch device of the inputs (CPU for block weights, whose model is a skeleton)
        self.tokenizer: Any = None
        self._chat_prompts: Optional[ChatPromptEncoder] = None
        self.max_model_len = 0
        self.weight_version = 0
        self.default_adapter: Optional[str] = None
        self.adapters: Dict[str, str] = {}
        self._eos_ids: set[int] = set()
        self._token_texts: Optional[TokenTexts] = None  # built at the first guided request
        self._waiting: Deque[_Request] = deque()
        self._cond = threading.Condition()
        self._pausers = 0
        self._stepping = False
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self._batch: Optional[Dict[str, Any]] = None
        self._batch_adapter: Optional[str] = None
        self._loaded = threading.Event()
        self._wrapped = False
        self._adapter_lock = threading.Lock()  # one adapter load or unload at a time
        self.fast_forward = fast_forward
        self._fast: Dict[Optional[str], Optional[FastForward]] = {}  # per adapter (None: base weights)
        self._fast_version = -1
        self._sampling_kernels: Any = None  # the fused kernels module, when the fast forward loaded them
        self.max_queued_tokens = max_queued_tokens
        self._queued_tokens = 0
        self._generated_tokens = 0
        self.quantization = quantization
        self.int8_activations = int8_activations
        self.blocks: Optional[BlockWeights] = None  # block-quantized weights being served, if any
        if prefix_cache_mb < 0:
            raise EngineError(f"prefix_cache_mb must be at least 0, got {prefix_cache_mb}")
        self._prefix_cache = PrefixCache(max_bytes=prefix_cache_mb * 2**20) if prefix_cache_mb else None

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        served_name: str = "model",
        max_batch_size: int = 8,
        max_model_len: Optional[int] = None,
        threads: Optional[int] = None,
        fast_forward: bool = True,
        prefix_cache_mb: int = 256,
    ) -> TransformersEngine:
        """Wrap an already loaded model (e.g. the one a trainer optimises) without copying it.

        Args:
            model: A transformers causal LM or a PEFT model around one.
            tokenizer: Its tokenizer.
            served_name: Model name reported to clients.
            max_batch_size: See the class.
            max_model_len: See the class.
            threads: See the class.
            fast_forward: See the class.
            prefix_cache_mb: See the class.

        Returns:
            A started engine.
        """
        engine = cls(
            served_name,
            served_name=served_name,
            max_batch_size=max_batch_size,
            max_model_len=max_model_len,
            threads=threads,
            fast_forward=fast_forward,
            prefix_cache_mb=prefix_cache_mb,
        )
        engine._attach(model, tokenizer)
        engine.start()
        return engine

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded and requests are accepted."""
        return self._loaded.is_set()

    def load(self) -> None:
        """Load model and tokenizer (blocking; called by :meth:`start` if needed)."""
        if self.loaded:
            return
        import torch

        from agentbolt.models import resolve_model

        if self.threads:
            torch.set_num_threads(self.threads)
        resolved = resolve_model(self.model_ref)
        if resolved.source == "gguf":
            raise EngineError(
                "the transformers engine needs a model directory; serve .gguf files with --engine llamacpp"
            )
        device = self.device_name or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = resolve_dtype(self.dtype_name)
        started = time.monotonic()
        plan = self._block_plan(resolved.path, device)
        if plan is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(resolved.path)
            model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype).to(device)  # type: ignore[arg-type]
            model.eval()
            logger.info("Loaded %s (%s, %s) in %.1f s", resolved.path, dtype, device, time.monotonic() - started)
        else:
            model = self._load_blocks(resolved.path, *plan)
            tokenizer = _block_model_tokenizer(resolved.path) if isinstance(model, BlockModel) else None
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(resolved.path)
            assert self.blocks is not None
            logger.info(
                "Loaded %s as block-quantized weights (%s; %.0f MB) in %.1f s",
                resolved.path,
                self.blocks.description,
                self.blocks.nbytes / 1e6,
                time.monotonic() - started,
            )
        self._attach(model, tokenizer)

    def _block_plan(self, path: Path, device: str) -> Optional[Tuple[Optional[Path], Optional[str], Any]]:
        """``(GGUF file or None, block format or None for the file's own, architecture)`` when block weights are
        served, else None. The architecture is the model's :class:`BlockModel` where its JSON config can be read
        alone, else its config as transformers reads it.

        Raises:
            EngineError: An explicit block format (``q8_0`` / ``q4_1``) cannot be served here.
        """
        import torch

        from agentbolt.serving.decode_kernels import load_decode_kernels
        from agentbolt.serving.fast_forward import FastForward
        from agentbolt.serving.quantized import gguf_source

        if self.quantization == "none":
            return None
        explicit = self.quantization != "auto"

        def refuse(reason: str) -> None:
            if explicit or self.int8_activations:
                activations = " with int8 activations" if self.int8_activations else ""
                raise EngineError(f"quantization {self.quantization!r}{activations} is not possible here: {reason}")
            logger.info("Serving float weights (quantization 'auto'): %s", reason)

        gguf = gguf_source(path)
        if not explicit and gguf is None:
            return refuse(f"{path} was not converted from a GGUF file")
        if torch.device(device).type != "cpu":
            return refuse(f"block weights are served on CPUs, not {device}")
        if not self.fast_forward:
            return refuse("block weights need the lean forward (fast_forward=False was given)")
        architecture = BlockModel.from_directory(path) or _transformers_config(path)
        reason = FastForward.config_reason(getattr(architecture, "config", architecture))
        if reason is not None:
            return refuse(reason)
        kernels = load_decode_kernels()
        if kernels is None or not hasattr(kernels, "block_linear"):
            return refuse("the compiled decoding kernels are unavailable (see the warning logged about them)")
        return gguf, None if self.quantization == "auto" else self.quantization, architecture

    def _load_blocks(self, path: Path, gguf: Optional[Path], kind: Optional[str], architecture: Any) -> Any:
        """Load block weights into :attr:`blocks`; return the :class:`BlockModel` ``architecture`` or, for a
        transformers config, a model skeleton (architecture only, ``meta`` device)."""
        import torch

        from agentbolt.serving.quantized import load_gguf_blocks, quantize_model

        model: Any
        if gguf is not None:
            model = architecture
            if not isinstance(model, BlockModel):
                from transformers import AutoModelForCausalLM

                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(architecture)
            self.blocks = load_gguf_blocks(gguf, model.config, kind)
        else:
            from transformers import AutoModelForCausalLM

            assert kind is not None
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            self.blocks = quantize_model(model, kind)
            model = model.to("meta")  # the float weights are no longer needed
        if self.int8_activations:
            self.blocks.use_int8_activations()
            self.blocks.description += ", int8 activations"
        if isinstance(model, BlockModel):
            return model
        from transformers import GenerationConfig

        with contextlib.suppress(OSError):
            model.generation_config = GenerationConfig.from_pretrained(path)
        return model.eval()

    def _attach(self, model: Any, tokenizer: Any) -> None:
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        self.model = model
        self.tokenizer = tokenizer
        self._chat_prompts = ChatPromptEncoder(tokenizer)
        self.device = torch.device("cpu") if self.blocks is not None else model.device
        config = model.config
        context = int(getattr(config, "max_position_embeddings", 0) or getattr(tokenizer, "model_max_length", 2048))
        self.max_model_len = min(self._max_model_len_override or context, context)
        eos: set[int] = set()
        generation_config = getattr(model, "generation_config", None)
        for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(x) for x in source)
        self._eos_ids = eos
        if getattr(model, "peft_config", None):
            self.adapters.update({name: "" for name in model.peft_config})
        from agentbolt.serving.fast_forward import FastForward

        if self.fast_forward and FastForward.unsupported_reason(model, weights=self.blocks is None) is None:
            # Compile the decoding kernels (once per machine) before accepting requests. The fused weight copies are
            # built later, by the scheduler thread: torch work in a second thread gives the process a second OpenMP
            # team, and with more OpenMP threads than CPUs libgomp cuts spin-waiting, which slows decoding ~1.5x.
            from agentbolt.serving.decode_kernels import load_decode_kernels

            self._sampling_kernels = load_decode_kernels()
        self._loaded.set()

    def start(self) -> None:
        """Load the model if needed and start the scheduler thread (idempotent; returns once loaded).

        The scheduler thread loads the model itself: every torch operation of the engine then runs in that one
        thread, so the process keeps a single OpenMP team (see :func:`configure_openmp`).

        Raises:
            Exception: Whatever loading raised.
        """
        if self._thread is not None:
            return
        self._stopping = False
        failure: List[BaseException] = []
        ready = threading.Event()

        def run() -> None:
            try:
                self.load()
            except BaseException as exc:
                failure.append(exc)
                return
            finally:
                ready.set()
            self._loop()

        self._thread = threading.Thread(target=run, name="agentbolt-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]

    def stop(self) -> None:
        """Stop the scheduler; pending and running requests fail with ``EngineError("engine stopped")``."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ------------------------------------------------------------------ weights and adapters

    @contextlib.contextmanager
    def weights_update(self) -> Iterator[Any]:
        """Hold generation between two decoding steps while the caller changes weights in place.

        Yields:
            The model object.

        Raises:
            EngineError: The engine serves block-quantized weights, which do not follow weight updates.
        """
        self._require_float_weights("weight updates")
        with self._cond:
            self._pausers += 1
            while self._stepping:
                self._cond.wait()
        try:
            yield self.model
        finally:
            with self._cond:
                self._pausers -= 1
                self.weight_version += 1
                self._cond.notify_all()

    def _require_float_weights(self, what: str) -> None:
        if self.blocks is not None:
            raise EngineError(
                f"{what} need the float weights, and this engine serves block-quantized ones "
                f"({self.blocks.description}); load it with quantization='none' (agentbolt serve --quantization none)"
            )

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> None:
        """Copy new weights into the live model between decoding steps (bumps :attr:`weight_version`)."""
        with self.weights_update() as model:
            model.load_state_dict(state_dict, strict=strict)

    def load_adapter(self, name: str, path: Union[str, os.PathLike[str]]) -> None:
        """Load a PEFT LoRA adapter from ``path``; requests select it by using ``name`` as the model.

        Loads and unloads run one at a time. An adapter that fails to load leaves the model as it was.

        Raises:
            EngineError: Name taken, clashes with the served model, or the adapter cannot be loaded.
        """
        self._require_float_weights("LoRA adapters")
        if not name or name == self.served_name:
            raise EngineError(f"invalid adapter name {name!r}")
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(f"{os.fspath(path)!r} is not a PEFT adapter directory (no adapter_config.json)")
        if not any((Path(path) / weights).is_file() for weights in ("adapter_model.safetensors", "adapter_model.bin")):
            # peft would then take the path for a Hub repository id and fail with a message about repo ids
            raise EngineError(f"{os.fspath(path)!r} holds no adapter weights (adapter_model.safetensors or .bin)")
        try:
            from peft import PeftModel
        except ImportError:  # pragma: no cover - depends on the environment
            raise EngineError("LoRA adapters need peft: pip install 'agentbolt[train]'") from None
        with self._adapter_lock:
            if name in self.adapters:  # checked under the lock: two loads of one name must not both proceed
                raise EngineError(f"adapter {name!r} is already loaded")
            with self.weights_update():
                try:
                    if isinstance(self.model, PeftModel):
                        try:
                            self.model.load_adapter(os.fspath(path), adapter_name=name)
                        except Exception:
                            if name in self.model.peft_config:  # the layers were added before the weights failed
                                self.model.delete_adapter(name)
                            raise
                    else:
                        self.model = self._wrap_with_adapter(name, os.fspath(path))
                        self._wrapped = True
                    self.model.eval()
                except Exception as exc:
                    raise EngineError(f"cannot load adapter {name!r} from {os.fspath(path)!r}: {exc}") from exc
                self.adapters[name] = os.fspath(path)

    def _wrap_with_adapter(self, name: str, path: str) -> Any:
        """The plain model wrapped in a PEFT model with adapter ``name`` loaded (``PeftModel.from_pretrained``'s
        steps), or the plain model unchanged, LoRA layers removed, when the adapter's weights do not fit it."""
        from peft import PeftConfig, PeftModel
        from peft.auto import MODEL_TYPE_TO_PEFT_MODEL_MAPPING

        config = PeftConfig.from_pretrained(path)
        config.inference_mode = True
        wrapper = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(config.task_type, PeftModel)
        with peft_wrapping():
            wrapped = wrapper(self.model, config, name)
        try:
            wrapped.load_adapter(path, name, is_trainable=False)
        except Exception:
            wrapped.unload()  # the base model's layers were replaced by LoRA layers: put them back
            raise
        return wrapped

    def unload_adapter(self, name: str) -> None:
        """Remove a loaded adapter (waits until no running sequence uses it; waiting requests for it fail with
        :class:`~agentbolt.serving.params.AdapterNotLoadedError`).

        Raises:
            EngineError: Unknown adapter.
        """
        with self._adapter_lock:
            if name not in self.adapters:
                raise EngineError(f"adapter {name!r} is not loaded")
            with self._cond:
                self._pausers += 1
                while True:
                    while self._stepping:  # held paused: the next step waits for this check
                        self._cond.wait()
                    if self._batch is None or self._batch_adapter != name:
                        break
                    self._pausers -= 1  # let the batch using the adapter run to its end
                    self._cond.notify_all()  # the scheduler may be asleep, paused by this very call
                    self._cond.wait(0.05)
                    self._pausers += 1
            try:
                self.model.delete_adapter(name)
                del self.adapters[name]
                if not self.adapters and self._wrapped:
                    self.model = self.model.unload()  # back to the plain base model, LoRA layers removed
                    self._wrapped = False
                if self.default_adapter == name:
                    self.default_adapter = None
            finally:
                with self._cond:
                    self._pausers -= 1
                    self.weight_version += 1
                    self._cond.notify_all()

    # ------------------------------------------------------------------ requests

    def encode_chat(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        *,
        assistant_prefix: str = "",
        **template_kwargs: Any,
    ) -> List[int]:
        """Render messages (and tools) with the model's chat template and tokenize them.

        The template's control tokens are parsed; the text of a special token inside the messages, tool calls, tools
        or template variables is tokenized as plain text (:mod:`agentbolt.serving.chat_prompt`).

        Args:
            messages: The conversation (``role`` / ``content`` dicts, tool calls included).
            tools: Tools offered to the model (OpenAI's ``tools`` entries).
            assistant_prefix: Text the answer must start with, appended after the generation prompt (the start of
                a forced tool call, for example); it becomes part of the prompt.
            **template_kwargs: Extra variables for the template.

        Raises:
            EngineError: The model is not loaded or has no chat template, the template rejects the conversation, the
                text holds characters that are not valid Unicode (lone surrogates), or the template changes text that
                holds a special token's text.
        """
        if self._chat_prompts is None:
            raise EngineError("the model is not loaded yet")
        return self._chat_prompts.encode(
            messages, tools, assistant_prefix=assistant_prefix, template_kwargs=template_kwargs
        )

    def encode(self, text: str) -> List[int]:
        """Tokenize a completion prompt (with the tokenizer's usual special tokens, e.g. BOS).

        The text of special tokens in it becomes those tokens (``<|im_end|>`` its id): a raw prompt is the client's
        own token stream, unlike the messages of :meth:`encode_chat`.

        Raises:
            EngineError: ``text`` holds characters that are not valid Unicode (lone surrogates).
        """
        check_unicode(text, "prompt")
        return list(self.tokenizer(text).input_ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize without special tokens."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: token ids must be below it."""
        if isinstance(self.model, BlockModel):
            return int(self.model.config.vocab_size)
        return int(self.model.get_input_embeddings().num_embeddings)

    def check_request(self, prompt: List[int], params: SamplingParams, adapter: Optional[str] = None) -> None:
        """Validate a request without submitting it: whatever passes cannot fail a batch step on its own.

        Raises:
            EngineError: Invalid parameters, token ids or adapter, or the model is not loaded.
            ContextOverflowError: Prompt plus ``max_tokens`` exceed the context length.
        """
        if not self.loaded:
            raise EngineError("model is still loading")
        params.validate()
        if params.guided_regex is not None:
            RegexGuide(params.guided_regex)  # a pattern that does not compile is refused here
        if not prompt:
            raise EngineError("prompt is empty")
        vocab = self.vocab_size
        if (
            any(isinstance(t, bool) or not isinstance(t, int) for t in prompt)
            or min(prompt) < 0
            or max(prompt) >= vocab
        ):
            raise EngineError(f"prompt token ids must be integers in [0, {vocab})")
        if params.stop_token_ids and max(params.stop_token_ids) >= vocab:
            raise EngineError(f"stop_token_ids must be in [0, {vocab}), got {max(params.stop_token_ids)}")
        if adapter is not None and adapter not in self.adapters:
            raise AdapterNotLoadedError(f"adapter {adapter!r} is not loaded")
        budget = self.max_model_len - len(prompt)
        if budget < 1 or (params.max_tokens is not None and params.max_tokens > budget):
            requested = len(prompt) + (params.max_tokens or 1)
            raise ContextOverflowError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{requested} tokens ({len(prompt)} in the messages, {params.max_tokens or 1} in the completion). "
                "Please reduce the length of the messages or completion."
            )

    def request_cost(self, prompt: Sequence[int], params: SamplingParams) -> int:
        """Tokens of work a request may cause: its prompt plus ``n`` times the tokens it may generate
        (``max_tokens``, or what is left of the context without it). What :attr:`max_queued_tokens` bounds."""
        budget = max(self.max_model_len - len(prompt), 0)
        return len(prompt) + params.n * min(params.max_tokens or budget, budget)

    @property
    def queued_tokens(self) -> int:
        """Tokens of work (:meth:`request_cost`) held by the requests waiting or running now."""
        return self._queued_tokens

    def stats(self) -> Dict[str, int]:
        """Counters: ``waiting`` requests, ``running`` sequences, ``queued_tokens``, ``generated_tokens`` so far."""
        with self._cond:
            waiting = sum(1 for request in self._waiting if not request.cancelled)
        batch = self._batch
        return {
            "waiting": waiting,
            "running": len(batch["seqs"]) if batch is not None else 0,
            "queued_tokens": self._queued_tokens,
            "generated_tokens": self._generated_tokens,
        }

    def _submit(self, request: _Request) -> None:
        self.check_request(request.prompt, request.params, request.adapter)
        if request.params.guided_regex is not None:
            request.guide = RegexGuide(request.params.guided_regex)
        if self._thread is None:
            raise EngineError("engine is not started")
        cost = self.request_cost(request.prompt, request.params)
        with self._cond:
            limit = self.max_queued_tokens
            if limit is not None and self._queued_tokens + cost > limit:
                if cost > limit:
                    raise EngineError(
                        f"this request asks for up to {cost} tokens of work (prompt + n x max_tokens), more than the "
                        f"{limit} the engine queues at once; lower max_tokens, n or the prompt"
                    )
                raise EngineOverloadedError(
                    f"the server is busy: {self._queued_tokens} of its {limit} queued tokens are taken and this "
                    f"request needs {cost}; retry shortly"
                )
            request.cost, request.released = cost, False
            self._queued_tokens += cost
            self._waiting.append(request)
            self._cond.notify_all()

    def _release(self, request: _Request) -> None:
        """Give back the queued tokens of a request that ended (finished, failed or abandoned by its caller)."""
        with self._cond:
            if not request.released:
                request.released = True
                self._queued_tokens -= request.cost

    def _abandon(self, request: _Request) -> None:
        """The caller stopped listening: drop the request at the next step and give back its tokens."""
        request.cancelled = True
        self._release(request)

    def _resolve_adapter(self, adapter: Optional[str]) -> Optional[str]:
        return adapter if adapter is not None else self.default_adapter

    async def stream(
        self, prompt: List[int], params: SamplingParams, adapter: Optional[str] = None
    ) -> AsyncGenerator[List[SequenceDelta], None]:
        """Generate asynchronously, yielding the deltas of every decoding step as they are produced.

        Cancelling the iteration (e.g. a client disconnect) drops the request from the batch.

        Args:
            prompt: Prompt token ids.
            params: Sampling parameters.
            adapter: LoRA adapter name (default: :attr:`default_adapter`).

        Raises:
            EngineError: Invalid request (before anything is yielded).
            EngineOverloadedError: The engine's queue is full (:attr:`max_queued_tokens`).
            GenerationFailedError: Generating this request failed inside the engine.
        """
        loop = asyncio.get_running_loop()
        channel: asyncio.Queue[Union[List[SequenceDelta], BaseException]] = asyncio.Queue()
        request = _Request(
            list(prompt),
            params,
            self._resolve_adapter(adapter),
            emit=lambda deltas: loop.call_soon_threadsafe(channel.put_nowait, deltas),
            fail=lambda exc: loop.call_soon_threadsafe(channel.put_nowait, exc),
        )
        self._submit(request)
        remaining = params.n
        try:
            while remaining:
                item = await channel.get()
                if isinstance(item, BaseException):
                    raise item
                remaining -= sum(1 for delta in item if delta.finish_reason is not None)
                yield item
        finally:
            self._abandon(request)

    async def generate(
        self, prompt: List[int], params: SamplingParams, adapter: Optional[str] = None
    ) -> GenerationOutput:
        """Generate asynchronously and return the finished choices (see :meth:`stream` for the errors)."""
        outputs = [SequenceOutput(index=i) for i in range(params.n)]
        version = self.weight_version
        async for deltas in self.stream(prompt, params, adapter):
            for delta in deltas:
                outputs[delta.index].add(delta)
        return GenerationOutput(prompt_token_ids=list(prompt), choices=outputs, weight_version=version)

    def generate_sync(
        self, prompt: List[int], params: SamplingParams, adapter: Optional[str] = None, timeout: Optional[float] = None
    ) -> GenerationOutput:
        """Blocking :meth:`generate` for callers without an event loop (e.g. a trainer thread)."""
        channel: queue.Queue[Union[List[SequenceDelta], BaseException]] = queue.Queue()
        request = _Request(list(prompt), params, self._resolve_adapter(adapter), channel.put, channel.put)
        version = self.weight_version
        self._submit(request)
        outputs = [SequenceOutput(index=i) for i in range(params.n)]
        remaining = params.n
        try:
            while remaining:
                item = channel.get(timeout=timeout)
                if isinstance(item, BaseException):
                    raise item
                for delta in item:
                    outputs[delta.index].add(delta)
                    remaining -= delta.finish_reason is not None
        finally:
            self._abandon(request)
        return GenerationOutput(prompt_token_ids=list(prompt), choices=outputs, weight_version=version)

    # ------------------------------------------------------------------ scheduler

    def _loop(self) -> None:
        import torch

        while True:
            with self._cond:
                while not self._stopping and (self._pausers or (self._batch is None and not self._waiting)):
                    self._cond.wait()
                if self._stopping:
                    break
                self._stepping = True
                admitted = self._take_admissible()
            try:
                with torch.inference_mode():
                    self._step(admitted)
            except Exception as exc:  # a failure no request can be blamed for must not kill the server
                logger.exception("Generation step failed")
                self._fail_all(admitted, exc)
            finally:
                with self._cond:
                    self._stepping = False
                    self._cond.notify_all()
        self._fail_all([], EngineError("engine stopped"))
        with self._cond:
            pending, self._waiting = list(self._waiting), deque()
        for request in pending:
            self._fail_request(request, EngineError("engine stopped"))

    def _take_admissible(self) -> List[_Request]:
        """Pop waiting requests that fit in the batch and share its adapter (called under the lock)."""
        running = len(self._batch["seqs"]) if self._batch is not None else 0
        adapter = self._batch_adapter if self._batch is not None else None
        taken: List[_Request] = []
        kept: Deque[_Request] = deque()
        while self._waiting:
            request = self._waiting.popleft()
            if request.cancelled:
                continue
            if request.adapter is not None and request.adapter not in self.adapters:
                # unloaded while the request waited: never run it on other weights
                self._fail_request(
                    request,
                    AdapterNotLoadedError(f"adapter {request.adapter!r} was unloaded before this request started"),
                )
                continue
            if running == 0 and not taken:
                adapter = request.adapter
            fits = running + request.params.n <= self.max_batch_size or (running == 0 and not taken)
            if fits and request.adapter == adapter and not kept:
                taken.append(request)
                running += request.params.n
            else:
                kept.append(request)
        self._waiting = kept
        return taken

    def _fail_request(self, request: _Request, exc: BaseException) -> None:
        """End one request with ``exc``; its sequences leave the batch at the end of this step."""
        if request.cancelled and request.released:
            return
        request.cancelled = True
        self._release(request)
        if not isinstance(exc, (EngineError, GenerationFailedError)):
            exc = GenerationFailedError(f"generation failed: {type(exc).__name__}: {exc}")
        try:
            request.fail(exc)
        except Exception:  # the caller's channel is gone (its event loop closed): nothing left to tell
            logger.debug("Could not deliver the failure of a request", exc_info=True)

    def _fail_all(self, admitted: List[_Request], exc: BaseException) -> None:
        failed = {id(r): r for r in admitted}
        if self._batch is not None:
            failed.update({id(s.request): s.request for s in self._batch["seqs"]})
        self._batch = None
        for request in failed.values():
            self._fail_request(request, exc)

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> Any:
        """Run the model on new tokens of every row; return the last position's float32 logits ``[batch, vocab]``
        (output projection in float32, see :mod:`agentbolt.serving.logits`)."""
        from agentbolt.serving.logits import float32_logits

        fast = self._fast_forward_for_step()
        if fast is not None:
            return fast(input_ids, positions, mask, cache)
        kwargs = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": positions,
            "past_key_values": cache.as_transformers_cache(),
            "use_cache": True,
        }
        adapter = self._batch_adapter
        if self.adapters:
            if adapter is None:
                with self.model.disable_adapter():
                    return float32_logits(self.model, 1, **kwargs)[:, -1, :]
            if self.model.active_adapter != adapter:
                self.model.set_adapter(adapter)
        return float32_logits(self.model, 1, **kwargs)[:, -1, :]

    def _fast_forward_for_step(self) -> Optional[FastForward]:
        """The lean forward for the current weights and the batch's adapter (rebuilt after weight changes)."""
        if not self.fast_forward:
            return None
        from agentbolt.serving.fast_forward import FastForward

        if self.blocks is not None:  # fixed weights: built once
            if None not in self._fast:
                self._fast[None] = FastForward.create(self.model, None, blocks=self.blocks)
            return self._fast[None]
        adapter = self._batch_adapter if self.adapters else None
        if self._fast_version != self.weight_version:  # weights or adapters changed: rebuild what is stale
            self._fast_version = self.weight_version
            base = _base_model(self.model)
            kept: Dict[Optional[str], Optional[FastForward]] = {}
            if FastForward.unsupported_reason(self.model) is None:
                for name, fast in self._fast.items():
                    if fast is not None and fast.model is base and (name is None or name in self.adapters):
                        fast.refresh()
                        kept[name] = fast
            self._fast = kept
        if adapter not in self._fast:
            self._fast[adapter] = FastForward.create(self.model, adapter)
        return self._fast[adapter]

    def _new_sequences(self, request: _Request) -> List[_Sequence]:
        """The sequences (one per choice) of a newly admitted request, each with its own seeded generator."""
        import torch

        request.weight_version = self.weight_version
        budget = self.max_model_len - len(request.prompt)
        max_tokens = min(request.params.max_tokens or budget, budget)
        seqs = []
        for choice in range(request.params.n):
            generator = torch.Generator(device="cpu")
            seed = request.params.seed + choice if request.params.seed is not None else random.getrandbits(62)
            generator.manual_seed(seed)
            seqs.append(_Sequence(request, choice, max_tokens, generator))
        return seqs

    def _prefill(self, requests: List[_Request]) -> Optional[Dict[str, Any]]:
        """Prefill newly admitted requests together into a batch to merge; a request that fails fails alone.

        A request whose own setup fails (its generators) is dropped before the forward pass. If the joint forward
        pass fails, the requests are prefilled one at a time, so only those that fail on their own fail.
        """
        ready: List[Tuple[_Request, List[_Sequence]]] = []
        for request in requests:
            try:
                ready.append((request, self._new_sequences(request)))
            except Exception as exc:
                logger.warning("A request failed before its prefill (%s: %s)", type(exc).__name__, exc)
                self._fail_request(request, exc)
        if not ready:
            return None
        try:
            return self._prefill_rows(ready)
        except Exception as exc:
            if len(ready) == 1:
                logger.warning("Prefill of a request failed (%s: %s)", type(exc).__name__, exc, exc_info=True)
                self._fail_request(ready[0][0], exc)
                return None
            logger.warning("Prefill of %d requests failed (%s): prefilling them one at a time", len(ready), exc)
        batch: Optional[Dict[str, Any]] = None
        for request, seqs in ready:
            try:
                part = self._prefill_rows([(request, seqs)])
            except Exception as exc:
                logger.warning("Prefill of a request failed (%s: %s)", type(exc).__name__, exc, exc_info=True)
                self._fail_request(request, exc)
                continue
            batch = part if batch is None else self._merge(batch, part)
        return batch

    def _prefill_rows(self, ready: List[Tuple[_Request, List[_Sequence]]]) -> Dict[str, Any]:
        import torch

        requests = [request for request, _ in ready]
        device = self.device
        cache, logits, mask, last_positions = self._prefill_prompts([r.prompt for r in requests])
        # One row per choice: n > 1 shares the prompt's prefill.
        index = torch.tensor([row for row, r in enumerate(requests) for _ in range(r.params.n)], device=device)
        if len(index) != len(requests):
            cache.select_rows(index)
        return {
            "seqs": [seq for _, seqs in ready for seq in seqs],
            "cache": cache,
            "mask": mask.index_select(0, index),
            "positions": last_positions.index_select(0, index) + 1,
            "logits": logits.index_select(0, index),
        }

    def _prefill_prompts(self, prompts: List[List[int]]) -> Tuple[KVCache, Any, Any, Any]:
        """Prefill ``prompts`` as one left-padded batch, reusing cached prefix states (:mod:`.prefix_cache`).

        Each row's longest cached prefix is loaded into the key/value cache and only the rest of the batch is run:
        ``new`` columns for every row, where ``new`` is the longest uncached part (rows with a longer cached prefix
        recompute its end). The prompts' whole blocks are cached afterwards.

        Returns:
            The batch's cache, last-position logits ``[batch, vocab]``, attention mask ``[batch, width]`` and the
            position of each row's last token ``[batch]``.
        """
        import torch

        device = self.device
        prefix = self._prefix_cache
        matched: List[List[CachedBlock]] = [[] for _ in prompts]
        if prefix is not None:
            prefix.use_namespace((self._batch_adapter, self.weight_version))
            self._share_prefixes(prompts)
            matched = [prefix.match(prompt, len(prompt) - 1) for prompt in prompts]
        # Every row computes at least its last token (its logits are needed), whatever its blocks hold.
        reusable = [
            min(sum(block.length for block in blocks), len(prompt) - 1)
            for prompt, blocks in zip(prompts, matched, strict=True)
        ]
        new = max(len(prompt) - reused for prompt, reused in zip(prompts, reusable, strict=True))
        past = max(len(prompt) - min(new, len(prompt)) for prompt in prompts)
        width = past + new
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(prompts), new), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        positions = torch.zeros((len(prompts), new), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            fresh = min(new, len(prompt))
            ids[row, new - fresh :] = torch.tensor(prompt[len(prompt) - fresh :])
            mask[row, width - len(prompt) :] = 1
            positions[row, new - fresh :] = torch.arange(len(prompt) - fresh, len(prompt))
        cache = KVCache()
        if past:
            self._load_prefixes(cache, prompts, matched, past, new)
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        logits = self._forward(ids, mask, positions, cache)
        if prefix is not None:
            for row, prompt in enumerate(prompts):
                start = width - len(prompt)

                def states(layer: int, begin: int, end: int, row: int = row, start: int = start) -> Any:
                    keys, values = cache.keys[layer], cache.values[layer]
                    assert keys is not None and values is not None
                    return keys[row, :, start + begin : start + end], values[row, :, start + begin : start + end]

                prefix.insert(prompt, states, len(cache.keys))
        return cache, logits, mask, positions[:, -1]

    @staticmethod
    def _load_prefixes(
        cache: KVCache, prompts: List[List[int]], matched: List[List[CachedBlock]], past: int, new: int
    ) -> None:
        """Write each row's cached prefix states into ``past`` right-aligned columns of every layer of ``cache``."""
        import torch

        template = next(blocks[0] for blocks in matched if blocks)
        for layer in range(len(template.keys)):
            like = template.keys[layer]
            shape = (len(prompts), like.shape[0], past, like.shape[-1])
            keys, values = like.new_zeros(shape), like.new_zeros(shape)
            for row, (prompt, blocks) in enumerate(zip(prompts, matched, strict=True)):
                reused = len(prompt) - min(new, len(prompt))
                if reused:
                    keys[row, :, past - reused :] = torch.cat([b.keys[layer] for b in blocks], dim=1)[:, :reused]
                    values[row, :, past - reused :] = torch.cat([b.values[layer] for b in blocks], dim=1)[:, :reused]
            cache.append(layer, keys, values)

    def _share_prefixes(self, prompts: List[List[int]]) -> None:
        """Prefill once, and cache, the common prefix of prompts that start with the same uncached block.

        Requests that arrive together often share a long prompt prefix (a group of rollouts, one agent role); without
        this, the first batch after a weight update would compute it once per row.
        """
        prefix = self._prefix_cache
        assert prefix is not None
        size = prefix.block_size
        groups: Dict[Tuple[int, ...], List[List[int]]] = {}
        for prompt in prompts:
            if len(prompt) > size and prefix.cached_length(prompt) == 0:
                groups.setdefault(tuple(prompt[:size]), []).append(prompt)
        for group in groups.values():
            if len(group) < 2:
                continue
            common = min(len(p) for p in group) - 1
            for prompt in group[1:]:
                common = next((i for i in range(common) if prompt[i] != group[0][i]), common)
            common -= common % size
            if common >= size:
                self._prefill_prompts([group[0][:common]])

    @staticmethod
    def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
        import torch

        missing = width - tensor.shape[dim]
        if missing == 0:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = missing
        return torch.cat([torch.zeros(shape, dtype=tensor.dtype, device=tensor.device), tensor], dim=dim)

    def _merge(self, running: Dict[str, Any], new: Dict[str, Any]) -> Dict[str, Any]:
        """Concatenate two batches along the batch dimension, left padding the shorter one.

        Nothing of ``running`` changes until every part of the merged batch exists, so a failure leaves it intact.
        """
        import torch

        width = max(running["mask"].shape[1], new["mask"].shape[1])
        mask = torch.cat([self._left_pad(running["mask"], width, 1), self._left_pad(new["mask"], width, 1)])
        positions = torch.cat([running["positions"], new["positions"]])
        logits = torch.cat([running["logits"], new["logits"]])
        running["cache"].merge(new["cache"])
        return {
            "seqs": running["seqs"] + new["seqs"],
            "cache": running["cache"],
            "mask": mask,
            "positions": positions,
            "logits": logits,
        }

    def _decode(self, batch: Dict[str, Any]) -> None:
        """Run one decoding step for every running sequence, leaving next-token logits in the batch."""
        import torch

        last = torch.tensor([[s.token_ids[-1]] for s in batch["seqs"]], device=batch["mask"].device)
        # A sequence holding g of its max_tokens tokens feeds at most max_tokens - g more (this step's included).
        width = batch["mask"].shape[1]
        batch["cache"].planned_length = width + max(s.max_tokens - len(s.token_ids) for s in batch["seqs"])
        mask = torch.cat([batch["mask"], torch.ones_like(batch["mask"][:, :1])], dim=1)
        batch["logits"] = self._forward(last, mask, batch["positions"].unsqueeze(1), batch["cache"])
        batch["mask"] = mask
        batch["positions"] = batch["positions"] + 1

    def _step(self, admitted: List[_Request]) -> None:
        """One scheduler iteration: decode the running batch, prefill and merge the admitted requests, sample.

        Failures stay with the request that caused them: a request's setup, prefill, sampling, detokenization or
        delivery failing ends that request alone, and the others keep decoding. Only a failure of the decoding
        forward pass itself, one computation for every running row, ends the running requests (it cannot be
        attributed to one of them: their inputs were all validated).
        """
        import torch

        if self._batch is not None:
            try:
                self._decode(self._batch)
            except Exception as exc:
                logger.exception("A decoding step failed: its %d sequences fail", len(self._batch["seqs"]))
                self._fail_all([], exc)
        if admitted:
            if self._batch is None:
                self._batch_adapter = admitted[0].adapter
            new = self._prefill(admitted)
            if new is not None:
                try:
                    self._batch = new if self._batch is None else self._merge(self._batch, new)
                except Exception as exc:
                    logger.exception("Adding %d sequences to the batch failed", len(new["seqs"]))
                    for request in {id(s.request): s.request for s in new["seqs"]}.values():
                        self._fail_request(request, exc)
        batch = self._batch
        if batch is None:
            return
        logits, batch["logits"] = batch["logits"], None
        self._sample_and_emit(batch["seqs"], logits.float())
        keep = [i for i, s in enumerate(batch["seqs"]) if not s.finished and not s.request.cancelled]
        if not keep:
            self._batch = None
            return
        if len(keep) < len(batch["seqs"]):
            index = torch.tensor(keep, device=batch["mask"].device)
            batch["seqs"] = [batch["seqs"][i] for i in keep]
            batch["mask"] = batch["mask"].index_select(0, index)
            batch["positions"] = batch["positions"].index_select(0, index)
            batch["cache"].select_rows(index)
            # Drop leading columns that are padding for every remaining sequence.
            start = int(batch["mask"].any(dim=0).nonzero()[0])
            if start:
                batch["mask"] = batch["mask"][:, start:]
                batch["cache"].drop_leading(start)

    def _sample_isolated(self, seqs: List[_Sequence], logits: torch.Tensor) -> List[int]:
        """:meth:`_sample` for all rows; should that fail, row by row, failing only the rows that fail alone."""
        try:
            return self._sample(seqs, logits, self._sampling_kernels)
        except Exception:
            logger.warning("Sampling the batch failed: sampling row by row", exc_info=True)
        chosen = []
        for row, seq in enumerate(seqs):
            try:
                chosen.append(self._sample([seq], logits[row : row + 1], self._sampling_kernels)[0])
            except Exception as exc:
                self._fail_request(seq.request, exc)
                chosen.append(0)
        return chosen

    def _sample_and_emit(self, seqs: List[_Sequence], logits: torch.Tensor) -> None:
        import torch

        chosen = self._sample_isolated(seqs, self._guided_logits(seqs, logits))
        top = None
        chosen_logprobs: List[float] = []
        if any(s.request.params.logprobs for s in seqs):
            logprobs = torch.log_softmax(logits, dim=-1)
            want_top = max(s.request.params.top_logprobs for s in seqs)
            top = torch.topk(logprobs, want_top, dim=-1) if want_top else None
            picked = torch.tensor(chosen, device=logits.device).unsqueeze(1)
            chosen_logprobs = logprobs.gather(1, picked).squeeze(1).tolist()
        grouped: Dict[int, Tuple[_Request, List[SequenceDelta]]] = {}
        for row, seq in enumerate(seqs):
            request = seq.request
            if request.cancelled:
                continue
            try:
                delta = self._advance(seq, chosen[row])
            except Exception as exc:
                logger.warning("A sequence failed (%s: %s); its request fails", type(exc).__name__, exc, exc_info=True)
                self._fail_request(request, exc)
                continue
            params = request.params
            if params.logprobs:
                delta.logprobs = [chosen_logprobs[row]]
                if params.top_logprobs and top is not None:
                    pairs = list(zip(top.indices[row].tolist(), top.values[row].tolist(), strict=True))
                    delta.top_logprobs = [pairs[: params.top_logprobs]]
            grouped.setdefault(id(request), (request, []))[1].append(delta)
        for request, deltas in grouped.values():
            if request.cancelled:  # failed by one of its other sequences
                continue
            try:
                request.emit(deltas)
            except Exception as exc:  # e.g. the caller's event loop is closed
                self._fail_request(request, exc)
                continue
            self._generated_tokens += len(deltas)
            request.remaining -= sum(1 for delta in deltas if delta.finish_reason is not None)
            if request.remaining <= 0:
                self._release(request)

    def _guided_logits(self, seqs: List[_Sequence], logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with each guided row restricted to the tokens its guide allows (a copy; the reported
        log-probabilities keep coming from ``logits``). A row whose guide allows nothing fails its request alone."""
        guided = [row for row, seq in enumerate(seqs) if seq.request.guide is not None and not seq.request.cancelled]
        if not guided:
            return logits
        if self._token_texts is None:
            self._token_texts = TokenTexts.of_tokenizer(self.tokenizer, logits.shape[-1])
        texts = self._token_texts
        restricted = logits.clone()
        for row in guided:
            seq = seqs[row]
            guide = seq.request.guide
            assert guide is not None
            try:
                restricted[row] = guided_row(
                    logits[row],
                    texts.text_of(seq.token_ids),
                    guide,
                    texts,
                    seq.request.params.temperature,
                    self._eos_ids,
                    top_p=seq.request.params.top_p,
                    generator=seq.generator,
                )
            except Exception as exc:
                self._fail_request(seq.request, exc)
        return restricted

    @staticmethod
    def _sample(seqs: List[_Sequence], logits: torch.Tensor, kernels: Any = None) -> List[int]:
        """Pick each row's next token: argmax at temperature 0, else a draw from its tempered, top-p distribution.

        Sampling inverts the cumulative distribution at one uniform number from the sequence's own generator (a
        seed reproduces a choice whatever else is in the batch); the softmax and the search run on all sampled
        rows at once. With the fused kernels (``kernels``, from :mod:`agentbolt.serving.decode_kernels`), float32
        CPU logits and no top-p row, the same rule runs in one C++ call.
        """
        import torch

        rows = [row for row, seq in enumerate(seqs) if seq.request.params.temperature > 0]
        uniforms = [torch.rand(1, generator=seqs[row].generator) for row in rows]
        fused = kernels is not None and logits.device.type == "cpu" and logits.dtype == torch.float32
        if fused and all(seqs[row].request.params.top_p >= 1.0 for row in rows):
            temperatures = torch.tensor([seq.request.params.temperature for seq in seqs], dtype=torch.float32)
            draws = torch.zeros(len(seqs), dtype=torch.float32)
            if rows:
                draws[rows] = torch.cat(uniforms)
            return kernels.sample_tokens(logits.contiguous(), temperatures, draws).tolist()
        best = logits.max(dim=-1)
        chosen = best.indices.tolist()  # the first maximum, like argmax, and ~3x faster on CPUs
        if not rows:
            return chosen
        index = torch.tensor(rows, device=logits.device)
        temperatures = torch.tensor([seqs[row].request.params.temperature for row in rows], device=logits.device)
        # Unnormalized probabilities exp((logit - max) / T): the search below scales its target by the total mass.
        scaled = logits.index_select(0, index).sub_(best.values.index_select(0, index).unsqueeze(1))
        probs = scaled.div_(temperatures.unsqueeze(1)).exp_()
        for position, row in enumerate(rows):
            top_p = seqs[row].request.params.top_p
            if top_p < 1.0:  # keep the smallest set of most likely tokens whose mass reaches top_p
                sorted_probs, order = torch.sort(probs[position] / probs[position].sum(), descending=True)
                sorted_probs[sorted_probs.cumsum(0) - sorted_probs > top_p] = 0.0
                probs[position] = torch.zeros_like(sorted_probs).scatter_(0, order, sorted_probs)
        cumulative = probs.cumsum(dim=-1)
        targets = (torch.cat(uniforms).to(logits.device) * cumulative[:, -1]).unsqueeze(1)
        picked = torch.searchsorted(cumulative, targets, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)
        for row, token in zip(rows, picked.tolist(), strict=True):
            chosen[row] = token
        return chosen

    def _new_text(self, seq: _Sequence, last: bool) -> str:
        """The text ``seq``'s newest tokens add, decoding only them and a few tokens of context.

        Decoding from ``prefix_offset`` (tokens already turned into text) keeps the spaces and merges the
        tokenizer applies between tokens, and the difference to the context's own text is the new part. While the
        new tokens end inside a multi-byte character, nothing is returned until a later token completes it (or
        the sequence ends: ``last``).
        """
        context = self.decode(seq.token_ids[seq.prefix_offset : seq.read_offset])
        text = self.decode(seq.token_ids[seq.prefix_offset :])
        if not last and (len(text) <= len(context) or text.endswith("\ufffd")):
            return ""
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(seq.token_ids)
        return text[len(context) :]

    def _advance(self, seq: _Sequence, token: int) -> SequenceDelta:
        """Append ``token`` to ``seq``, apply the stop rules, and return the text it releases."""
        params = seq.request.params
        seq.token_ids.append(token)
        finish: Optional[str] = None
        stop_reason: Union[int, str, None] = None
        if token in self._eos_ids and not params.ignore_eos:
            finish = "stop"
        elif token in params.stop_token_ids:
            finish, stop_reason = "stop", token
        seq.text += self._new_text(seq, last=finish is not None or len(seq.token_ids) >= seq.max_tokens)
        if params.stop:
            window_start = max(0, seq.released - max(len(s) for s in params.stop))
            hits = [(at, stop) for stop in params.stop if (at := seq.text.find(stop, window_start)) >= 0]
            if hits:
                at, stop_reason = min(hits, key=lambda hit: hit[0])  # the first in the text (ties: the first given)
                seq.text = seq.text[:at]
                finish = "stop"
        if finish is None and len(seq.token_ids) >= seq.max_tokens:
            finish = "length"
        if finish is None:
            end = len(seq.text) - _held_back(seq.text, params.stop)
        else:
            end = len(seq.text)
            seq.finished = True
        released = seq.text[seq.released : max(end, seq.released)]
        seq.released = max(end, seq.released)
        return SequenceDelta(
            index=seq.index,
            token_ids=[token],
            text=released,
            finish_reason=finish,  # type: ignore[arg-type]
            stop_reason=stop_reason,
        )
