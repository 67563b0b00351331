"""What every rollout engine shares: the interface, batching and masks (what an engine is asked and
answers, sampling parameters included, is in requests.py).

An engine turns prompts into a ``Batch``: each prompt repeated ``n`` times in consecutive rows
([p0, p0, ..., p1, p1, ...]), prompts left-padded, responses right-padded with the response mask
covering the generated tokens up to and including the first EOS (with rollout.ignore_eos, every
generated token: an EOS then neither stops a row nor ends its mask). With rollout.target_lengths
each row has a target length (target_lengths.py): it generates as with ignore_eos and its mask
covers exactly its target; the engines decode only up to the longest target. The common work (repeating,
padding, micro-batching, eval mode, masks, assembling the Batch) lives here; an engine only
implements ``_generate_rows``, the decoding of one left-padded micro-batch described by a
``RowsRequest``; the static and fast engines share their decode loop too (decode_loop.py).
Every engine also returns each sampled token's log-prob (``GeneratedRows``): log softmax of the
engine's own logits over the temperature, before top-k/top-p filtering (at T = 1 for greedy), which
is what the trainer's old_log_prob computes; the Batch carries them as ``rollout_log_probs``.

Weight sync (the "reshard" phase): an engine holds a model. With ``share_weights=True`` (the default,
meant for CPU and for one process that trains and samples on the same device) the engine uses the
actor's own module, so ``sync_from`` is a pointer swap that copies nothing and the actor's updates are
seen at once. With ``share_weights=False`` the engine owns a separate copy and ``sync_from`` copies
the actor's tensors into it in place, so the engine's tensors keep their addresses (what a captured
CUDA graph needs) and the copy is the cost the reshard phase measures.

Traits: what the trainer (and the plugin) must know of an engine is a class attribute here, which an
engine overrides, read through the registry (``engine_class(name).accepts_sharded_model``), so no
module tests an engine's name; ``check_config`` is the engine's own start-up check of a config.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from trainer.batch import Batch, left_pad
from trainer.rollout.requests import GeneratedRows, RowsRequest, SamplingParams
from trainer.rollout.responses import finalize_responses, mask_to_targets, pad_right
from trainer.rollout.target_lengths import NO_TARGETS, draw_targets
from trainer.workers.fsdp import full_tensor

if TYPE_CHECKING:
    from trainer.config.schema import Config, RolloutConfig, TargetLengthsConfig


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class RolloutEngine(ABC):
    """Samples n responses per prompt from ``self.model``; see the module docstring for the contract."""

    name: ClassVar[str] = "base"
    # May be built on the actor's own module even when FSDP2 shards it: the engine only copies the
    # weights (gathered whole) into buffers of its own and never runs that module's forward (under
    # FSDP a collective). False: under FSDP2 a worker builds it an unsharded replica (at dp every
    # engine is built on the actor's module).
    accepts_sharded_model: ClassVar[bool] = False
    # Sizes its memory from actor_rollout_ref.rollout.gpu_memory_utilization (the others size their
    # KV cache from the batch and ignore the key).
    uses_memory_fraction: ClassVar[bool] = False
    # Decodes tensor-parallel over rollout.tensor_model_parallel_size workers (the others run one engine
    # per worker, and the key has no effect on them: config validation says so).
    supports_tensor_parallel: ClassVar[bool] = False
    # Returns each sampling distribution's entropy when SamplingParams.report_entropy asks (the sampler check).
    reports_entropy: ClassVar[bool] = False

    @staticmethod
    def check_config(cfg: Config) -> None:
        """The engine's start-up checks of a whole config (config validation calls them through the
        registry when this engine is chosen); raise ConfigError naming the key. None by default."""
        return None

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        config: RolloutConfig | None = None,
        share_weights: bool = True,
    ) -> None:
        self.model = model
        self.share_weights = share_weights
        self.micro_batch_size = int(config.micro_batch_size) if config is not None else 0
        if self.micro_batch_size < 0:
            raise ValueError(f"rollout.micro_batch_size must be >= 0 (0: whole batch), got {self.micro_batch_size}")
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; a rollout needs one to end responses")
        self.eos_token_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad) if pad is not None else self.eos_token_ids[0]
        # ignore_eos: an EOS neither stops a row nor ends its response mask (fixed-length work).
        self.ignore_eos = bool(config.ignore_eos) if config is not None else False
        self.target_lengths: TargetLengthsConfig | None = (
            config.target_lengths if config is not None and config.target_lengths.distribution != NO_TARGETS else None
        )

    def warm_up(self, prompts: int, n: int, prompt_len: int, max_new_tokens: int, sampling: SamplingParams) -> float:
        """Compile and capture, before the first timed ``generate``, what a step of this shape will need
        (``prompts`` per worker, ``n`` rows each, prompts up to ``prompt_len`` tokens, ``max_new_tokens``);
        return the seconds it took. Nothing by default: only engines that compile kernels per shape
        need it, as vLLM compiles and captures when its engine starts. Every worker calls it at set-up."""
        return 0.0

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The tokens that end a response: the EOS ids, or none with ignore_eos or target lengths."""
        return () if self.ignore_eos or self.target_lengths is not None else self.eos_token_ids

    def row_targets(self, row_keys: torch.Tensor, seed: int, cap: int) -> torch.Tensor | None:
        """Each row's target length [B] (CPU int64), or None without rollout.target_lengths."""
        spec = self.target_lengths
        if spec is None:
            return None
        return draw_targets(spec.distribution, spec.mean, spec.sigma, row_keys, seed, cap)

    @property
    def device(self) -> torch.device:
        """Where the engine decodes (the model's device; engines with their own weights override)."""
        return model_device(self.model)

    # ------------------------------------------------------------------ the one public call
    def generate(
        self,
        prompt_token_lists: list[list[int]],
        uids: list[int],
        ground_truths: list[str],
        n: int,
        max_new_tokens: int,
        sampling: SamplingParams,
        seed: int,
    ) -> Batch:
        """Sample ``n`` responses of at most ``max_new_tokens`` per prompt; rows [p0 x n, p1 x n, ...].

        The same seed gives the same tokens on the same device. The Batch's tensors are on the
        model's device; the response width is the longest response (not max_new_tokens).
        """
        self._check_inputs(prompt_token_lists, uids, ground_truths, n, max_new_tokens)
        if sampling.report_entropy and not self.reports_entropy:
            raise ValueError(
                f"the {self.name} rollout engine does not report entropies (SamplingParams.report_entropy, "
                "which the sampler check asks for); the bundled fast, static and hf engines do"
            )
        rows = [list(p) for p in prompt_token_lists for _ in range(n)]
        device = self.device
        prompt_ids, prompt_mask = left_pad(rows, self.pad_token_id)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        step = self.micro_batch_size or len(rows)
        # Row j of prompt uid u has key u * n + j: its own sampling noise, wherever it runs.
        keys = torch.as_tensor([u * n + j for u in uids for j in range(n)], dtype=torch.long)
        row_keys = keys.to(device)
        host_targets = self.row_targets(keys, seed, max_new_tokens)  # drawn on the CPU: the same everywhere
        targets = host_targets.to(device) if host_targets is not None else None
        parts: list[GeneratedRows] = []
        with self._generation_mode(), self._seeded(seed, device) as generator:
            for mb, start in enumerate(range(0, len(rows), step)):
                rows_slice = slice(start, start + step)
                request = RowsRequest(
                    prompt_ids=prompt_ids[rows_slice],
                    prompt_mask=prompt_mask[rows_slice],
                    row_keys=row_keys[rows_slice],
                    max_new_tokens=max_new_tokens,
                    sampling=sampling,
                    seed=seed,
                    generator=generator,
                    micro_batch=mb,
                    row_offset=start,
                    n=n,
                    targets=targets[rows_slice] if targets is not None else None,
                    longest_target=int(host_targets[rows_slice].max()) if host_targets is not None else 0,
                )
                parts.append(self._generate_rows(request))
        width = max(p.tokens.shape[1] for p in parts)
        tokens = torch.cat([pad_right(p.tokens, width, self.pad_token_id) for p in parts])
        log_probs = torch.cat([pad_right(p.log_probs, width, 0) for p in parts])
        entropies = self._reported_entropies(parts, width, sampling)
        if targets is not None:
            longest = int(host_targets.max())
            if tokens.shape[1] < longest:
                raise RuntimeError(f"{self.name} rollout decoded {tokens.shape[1]} tokens, expected {longest} (targets)")
            response_ids, response_mask = mask_to_targets(tokens, targets, self.pad_token_id)
        else:
            response_ids, response_mask = finalize_responses(tokens, self.stop_token_ids, self.pad_token_id)
            longest = int(response_mask.sum(dim=1).max())  # one host read, after decoding
        response_mask = response_mask[:, :longest].contiguous()
        return Batch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids[:, :longest].contiguous(),
            response_mask=response_mask,
            uids=torch.as_tensor([u for u in uids for _ in range(n)], dtype=torch.long, device=device),
            ground_truths=[g for g in ground_truths for _ in range(n)],
            # where, not a product: a padded row's log-prob may be anything, NaN included
            rollout_log_probs=torch.where(response_mask.bool(), log_probs[:, :longest].float(), 0.0),
            rollout_entropies=(
                None if entropies is None else torch.where(response_mask.bool(), entropies[:, :longest].float(), 0.0)
            ),
        )

    def _reported_entropies(self, parts: list[GeneratedRows], width: int, sampling: SamplingParams) -> torch.Tensor | None:
        """The micro-batches' entropies [B, width] when ``sampling.report_entropy`` asked for them."""
        if not sampling.report_entropy:
            return None
        entropies = [p.entropies for p in parts]
        if any(e is None for e in entropies):
            raise RuntimeError(f"{self.name} rollout: asked for entropies, a micro-batch came back without them")
        return torch.cat([pad_right(e, width, 0) for e in entropies])

    @abstractmethod
    def _generate_rows(self, request: RowsRequest) -> GeneratedRows:
        """Decode one left-padded micro-batch: the raw generated tokens [b, <= max_new_tokens] and
        their log-probs (see ``GeneratedRows``).

        Rows that finished early may hold anything after their EOS (``generate`` masks it).
        Raise NonFiniteLogitsError through ``request.nonfinite`` (it names whole-batch rows).
        """

    @contextlib.contextmanager
    def _seeded(self, seed: int, device: torch.device) -> Iterator[torch.Generator | None]:
        """A generator seeded with ``seed`` on the model's device (engines may override)."""
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        yield generator

    @contextlib.contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """Eval mode (no dropout) and no autograd, restoring the model's training flag after.

        torch.no_grad rather than inference_mode: tensors made under inference_mode cannot be saved
        for backward, and the responses feed the actor's training forward later.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.train(was_training)

    def _check_inputs(
        self,
        prompts: list[list[int]],
        uids: list[int],
        ground_truths: list[str],
        n: int,
        max_new_tokens: int,
    ) -> None:
        if not prompts:
            raise ValueError("generate needs at least one prompt, got none")
        if len(uids) != len(prompts):
            raise ValueError(f"expected one uid per prompt ({len(prompts)}), got {len(uids)}")
        if ground_truths and len(ground_truths) != len(prompts):
            raise ValueError(f"expected one ground truth per prompt ({len(prompts)}) or none, got {len(ground_truths)}")
        if n < 1:
            raise ValueError(f"n (responses per prompt) must be >= 1, got {n}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        empty = [i for i, p in enumerate(prompts) if len(p) == 0]
        if empty:
            raise ValueError(f"prompts must have at least one token; empty prompts at indices {empty[:8]}")
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        longest = max(len(p) for p in prompts)
        if limit is not None and longest + max_new_tokens > limit:
            raise ValueError(
                f"longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                f"max_position_embeddings ({limit})"
            )

    # ------------------------------------------------------------------ reshard
    def sync_from(self, actor_model: nn.Module) -> int:
        """Make the engine sample from the actor's current weights; return the bytes copied.

        Shared (``share_weights=True``): the engine takes the actor's module itself, a pointer swap
        that copies nothing (returns 0). Otherwise the actor's tensors are copied in place.
        """
        if self.share_weights:
            self.model = actor_model
            return 0
        return self.load_weights(actor_model)

    def load_weights(self, weights: Mapping[str, torch.Tensor] | nn.Module) -> int:
        """Copy a state dict (or a module's) into the engine's model in place; return bytes copied.

        Keys and shapes must match the engine's model exactly; dtype and device are converted.
        Tied tensors (one storage under two names) are copied once.
        """
        source = weights.state_dict() if isinstance(weights, nn.Module) else dict(weights)
        target = self.model.state_dict()
        missing = sorted(target.keys() - source.keys())
        unexpected = sorted(source.keys() - target.keys())
        if missing or unexpected:
            raise ValueError(
                f"load_weights: keys differ from the engine's model: missing {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
            )
        copied = 0
        seen: set[int] = set()
        with torch.no_grad():
            for name, dst in target.items():
                # A sharded (FSDP2) parameter is gathered whole on this device: a collective, made in
                # the same order on every worker since they hold the same model.
                src = full_tensor(source[name], dst.device)
                if src.shape != dst.shape:
                    raise ValueError(f"load_weights: {name} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
                if dst.data_ptr() in seen:
                    continue
                seen.add(dst.data_ptr())
                dst.copy_(src)
                copied += dst.numel() * dst.element_size()
        return copied
