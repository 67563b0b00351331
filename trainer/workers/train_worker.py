"""One training worker: the actor, the reference and the rollout engine, colocated in one process.

Run as a Ray actor (see trainer/driver/worker_group.py). The workers form one torch.distributed group.
With the fsdp2 strategy (the default on GPU) the actor and the reference are sharded over the group
with FSDP2 (trainer/workers/fsdp.py), a group of one included; with dp (the default on CPU) each worker holds
a full replica and gradients are summed by one all-reduce per mini-batch. Either way each worker
holds its shard of every batch, and its rollout engine holds a full copy of the weights (or, on dp,
shares the actor's module), refreshed in the reshard phase on the device, without a trip through
the CPU or disk.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import torch

from trainer.batch import Batch
from trainer.checkpoint_files import CheckpointError, check_file
from trainer.config import Config, RolloutConfig
from trainer.models.checkpointing import enable_gradient_checkpointing
from trainer.models.liger import apply_liger
from trainer.models.packed_attention import build_row_plans
from trainer.models.presets import build_model, load_tokenizer, resolve_dtype
from trainer.rollout import engine_class, make_engine
from trainer.rollout.requests import SamplingParams
from trainer.rollout.tensor_parallel import decode_group_size, join_decode_group
from trainer.work_counts import WorkCounts, count_work
from trainer.workers.actor import UpdateSettings, compute_log_probs, update_policy
from trainer.workers.distributed import DataParallel, Rendezvous
from trainer.workers.fsdp import (
    PolicyModel,
    compute_dtype,
    full_model_state,
    load_full_model_state,
    load_optimizer_state,
    move_optimizer_state,
    optimizer_state,
    optimizer_state_on,
    reserve_pinned_moments,
    resolve_strategy,
    shard_model,
)
from trainer.workers.memory_peaks import PhasePeaks, worker_figures
from trainer.workers.phase_spans import PhaseSpans, span_figures
from trainer.workers.shard_state import ShardSources, load_shards, save_shard
from trainer.workers.training_warm_up import warm_up_mini_batches, warm_up_plan, warm_up_training


class TrainWorker:
    def __init__(self, cfg: Config, rank: int, world_size: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        on_gpu = cfg.trainer.device == "cuda"
        if on_gpu and not torch.cuda.is_available():
            raise RuntimeError(f"worker {rank}: trainer.device=cuda but torch sees no GPU in this process")
        self.device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
        self.memory = PhasePeaks(self.device)  # each phase's peak GPU memory, for the step's figures
        self.spans = PhaseSpans()  # when this worker ran each phase, set beside the driver's span of it
        if not on_gpu:
            # One thread per CPU worker, as its one Ray CPU: OpenMP threads spin-wait on each other,
            # and on an oversubscribed machine that turned a phase 100x slower instead of 2x.
            torch.set_num_threads(1)
        self.dp = DataParallel(rank, world_size, self.device)
        self.actor: torch.nn.Module | None = None
        self.ref: torch.nn.Module | None = None
        self.rendezvous: Rendezvous | None = None  # rank 0's, from address() to setup()

    # -- set-up -------------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group: a free port on its node's Ray address (the
        loopback address when every worker is on one node), bound now and held until ``setup``."""
        host = ray.util.get_node_ip_address() if self.cfg.trainer.nnodes > 1 else "127.0.0.1"
        self.rendezvous = Rendezvous(host)
        return host, self.rendezvous.port

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        cfg = self.cfg
        arr = cfg.actor_rollout_ref
        self.strategy = resolve_strategy(arr.actor.strategy, self.device.type)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        force = self.strategy == "fsdp2"
        self.dp.init(master_addr, master_port, backend, force=force, rendezvous=self.rendezvous)
        # rollout.tensor_model_parallel_size consecutive workers decode together (every worker joins, in order)
        self.decode_group = join_decode_group(self.rank, self.world_size, decode_group_size(cfg))
        path = arr.model.path
        fsdp = arr.actor.fsdp_config
        dtype = resolve_dtype(fsdp.model_dtype, cfg.trainer.device)
        # Every rank builds the same seeded weights, so the replicas (or the shards) start identical.
        lm = self._build_trained_model(path, dtype)
        if arr.model.enable_gradient_checkpointing:
            enable_gradient_checkpointing(
                lm, arr.model.gradient_checkpointing_policy, arr.model.gradient_checkpointing_layers
            )
        self.actor = self._wrap(PolicyModel(lm, packed=arr.model.use_remove_padding), fsdp.param_offload)
        optim = arr.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.actor.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
        )
        # With param_offload the optimizer steps on the CPU already (CPUOffloadPolicy).
        self.optimizer_offload = fsdp.optimizer_offload and not fsdp.param_offload and self.device.type == "cuda"
        if cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
            ref_fsdp = arr.ref.fsdp_config
            ref_dtype = resolve_dtype(ref_fsdp.model_dtype, cfg.trainer.device)
            ref = self._build_trained_model(path, ref_dtype)
            ref.requires_grad_(False).eval()
            self.ref = self._wrap(PolicyModel(ref, packed=arr.model.use_remove_padding), ref_fsdp.param_offload)
        self.tokenizer = load_tokenizer(path)
        self.actor_dtype = dtype
        self.engine = self._make_engine(arr.rollout)
        self.panel_engines: dict[str, Any] = {}  # name -> engine of the rollout panel (generate_with)
        # the engine's kernels compiled before the first timed gen, as vLLM's are when it starts, and
        # the training phases' before their first timed call (GPU only: on CPU nothing compiles)
        on_gpu = self.device.type == "cuda"
        warm_up = self._warm_up(self.engine) if on_gpu else 0.0
        training_warm_up, row_plans = self._warm_up_training() if on_gpu else (0.0, 0.0)
        # Last: what pins host memory before this (an offloaded ref's shards, of the moments' very
        # sizes) would take the reserved blocks from the pool for good.
        pinning = time.perf_counter()
        pinned = reserve_pinned_moments(self.optimizer) if self.optimizer_offload else 0
        pinning = time.perf_counter() - pinning
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            # which physical GPU: what the session's NVML telemetry reads (pytest_rlbench.session.gpu_watch)
            "gpu_uuid": str(torch.cuda.get_device_properties(self.device).uuid) if self.device.type == "cuda" else None,
            "threads": torch.get_num_threads(),
            "strategy": self.strategy,
            "attention": lm.config._attn_implementation,  # the actor's: sdpa, or packed rows (use_remove_padding)
            # optimizer_offload: host memory pinned at set-up for the moments' copies (fsdp.reserve_pinned_moments)
            "pinned_moment_bytes": pinned,
            "pinning_s": round(pinning, 3),
            "rollout_warm_up_s": round(warm_up, 3),
            "training_warm_up_s": round(training_warm_up, 3),
            "row_plans_s": round(row_plans, 3),
        }

    def _warm_up(self, engine: Any) -> float:
        """engine.warm_up at a step's shape: this worker's share of the prompts, n rows each, the
        prompt width and max_response_length."""
        data, rollout = self.cfg.data, self.cfg.actor_rollout_ref.rollout
        prompts = math.ceil(data.train_batch_size / self.world_size)  # the driver's even split: its largest share
        return engine.warm_up(
            prompts, rollout.n, self._prompt_width(), data.max_response_length, SamplingParams.from_config(rollout)
        )

    def _warm_up_training(self) -> tuple[float, float]:
        """warm_up_training (trainer/workers/training_warm_up.py) on warm_up_plan's short rows after
        the step's prompt width, and with packed rows on a GPU cuDNN's plans for every width a long
        row can take (packed_attention.build_row_plans): the seconds of each (0 where no plan was
        built), the device synchronised."""
        start = time.perf_counter()
        data, arr = self.cfg.data, self.cfg.actor_rollout_ref
        prompt_len = self._prompt_width()
        plan = warm_up_plan(prompt_len, data.max_response_length)
        # ids the model embeds: a tokenizer may name tokens past the embedding's rows
        vocab = min(len(self.tokenizer), self.actor.lm.get_input_embeddings().num_embeddings)
        mini_batches = warm_up_mini_batches(plan, prompt_len, vocab, torch.Generator().manual_seed(0))
        settings = UpdateSettings(
            temperature=arr.rollout.temperature, max_response_length=data.max_response_length,
            n_mini_batches=1, device=self.device,
        )
        warm_up_training(self.actor, self.ref, self.optimizer, mini_batches, arr.actor, settings, self.dp)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        warmed, built = time.perf_counter(), 0
        if self.device.type == "cuda" and arr.model.use_remove_padding:  # long packed rows' plans, every width
            built = build_row_plans(self.actor.lm.config, self.device,
                                    compute_dtype(self.actor_dtype, self.device.type),
                                    prompt_len + data.max_response_length)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the first timed phase starts from the allocator it would have met
        return warmed - start, (time.perf_counter() - warmed if built else 0.0)

    def _prompt_width(self) -> int:
        """A step's prompt columns: synthetic prompts are padded to synthetic_prompt_length (only
        without train_files); a prompt is never longer than max_prompt_length."""
        data = self.cfg.data
        synthetic = data.synthetic_prompt_length if not data.train_files else 0
        return min(synthetic or data.max_prompt_length, data.max_prompt_length)

    def _build_trained_model(self, path: str, dtype: torch.dtype) -> torch.nn.Module:
        """The actor's or ref's model: the session's seeded weights (every rank builds the same), with
        liger-kernel's layers when use_liger. The rollout's replica stays plain: it only samples."""
        lm = build_model(path, dtype=dtype, device=self.device, seed=self.cfg.trainer.seed)
        if self.cfg.actor_rollout_ref.model.use_liger:
            apply_liger(lm)
        return lm

    def _wrap(self, policy: PolicyModel, param_offload: bool) -> PolicyModel:
        if self.strategy == "fsdp2":
            return shard_model(policy, self.device, self.world_size, param_offload=param_offload)
        if param_offload:
            raise ValueError("fsdp_config.param_offload=True needs actor_rollout_ref.actor.strategy=fsdp2")
        return policy

    def _make_engine(self, rollout: RolloutConfig):
        """A rollout engine, holding its own full copy of the weights unless it can share the actor's.

        An engine that accepts a sharded model (the fast engine: its own fused, fixed-address buffers)
        is built on the actor's module under every strategy (in its decode group, with
        rollout.tensor_model_parallel_size > 1: tensor_parallel.py). The others get the actor's module on dp
        (the transformers-based ones share it); under FSDP a replica of their own, since every forward
        of a sharded module is a collective that the workers' rollouts cannot keep in step.
        """
        kind = engine_class(rollout.name)
        if kind.supports_tensor_parallel and self.decode_group is not None:
            engine = make_engine(rollout.name, self.actor.lm, self.tokenizer, rollout, tensor_parallel=self.decode_group)
        elif kind.accepts_sharded_model or self.strategy == "dp":
            engine = make_engine(rollout.name, self.actor.lm, self.tokenizer, rollout)
        else:
            dtype = compute_dtype(self.actor_dtype, self.device.type)
            path = self.cfg.actor_rollout_ref.model.path
            replica = build_model(path, dtype=dtype, device=self.device, seed=self.cfg.trainer.seed)
            replica.requires_grad_(False)
            engine = make_engine(rollout.name, replica, self.tokenizer, rollout, share_weights=False)
        engine.sync_from(self.actor.lm)
        return engine

    # -- phases -------------------------------------------------------------------------------
    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """A phase's call in this worker: its peak GPU memory and its span, for the step's figures."""
        with self.memory.phase(name), self.spans.phase(name):
            yield

    def reshard(self) -> None:
        """Hand the actor's current weights to the rollout engine."""
        self.memory.take()  # a step starts here: earlier calls' peaks and spans are not its own
        self.spans.take()
        with self._phase("reshard"):
            self.engine.sync_from(self.actor.lm)
            if self.device.type == "cuda":
                torch.cuda.synchronize()

    def generate(self, prompts: list[list[int]], uids: list[int], ground_truths: list[str], seed: int) -> Batch:
        with self._phase("generate_sequences"):
            return self._generate(self.engine, prompts, uids, ground_truths, seed)

    def generate_with(
        self, name: str, prompts: list[list[int]], uids: list[int], ground_truths: list[str], seed: int
    ) -> Batch:
        """``generate`` by another registered engine (the rollout panel): the same prompts, uids and
        seed, from the actor's current weights. The engine is built on first use, as the session's
        own is (its own instance even when ``name`` is the session's kind), and kept."""
        engine = self.panel_engines.get(name)
        if engine is None:
            rollout = dataclasses.replace(self.cfg.actor_rollout_ref.rollout, name=name)
            engine = self.panel_engines[name] = self._make_engine(rollout)
        else:
            engine.sync_from(self.actor.lm)  # this engine's reshard: the actor may have moved on
        return self._generate(engine, prompts, uids, ground_truths, seed)

    def _generate(
        self, engine: Any, prompts: list[list[int]], uids: list[int], ground_truths: list[str], seed: int
    ) -> Batch:
        rollout = self.cfg.actor_rollout_ref.rollout
        sampling = SamplingParams.from_config(rollout)
        batch = engine.generate(prompts, uids, ground_truths, rollout.n, self.cfg.data.max_response_length, sampling, seed)
        return batch.to("cpu")

    def _log_probs(self, model: torch.nn.Module, batch: Batch, micro: int, dynamic: bool, max_tokens: int) -> torch.Tensor:
        return compute_log_probs(
            model,
            batch,
            self.cfg.actor_rollout_ref.rollout.temperature,
            micro,
            dynamic,
            max_tokens,
            self.dp,
            self.device,
        )

    def compute_old_log_prob(self, batch: Batch) -> torch.Tensor:
        r = self.cfg.actor_rollout_ref.rollout
        with self._phase("old_log_prob"):
            return self._log_probs(
                self.actor, batch, r.log_prob_micro_batch_size_per_gpu, r.log_prob_use_dynamic_bsz,
                r.log_prob_max_token_len_per_gpu,
            )

    def compute_ref_log_prob(self, batch: Batch) -> torch.Tensor:
        if self.ref is None:
            raise RuntimeError("the reference model was not built: neither use_kl_loss nor use_kl_in_reward is set")
        r = self.cfg.actor_rollout_ref.ref
        with self._phase("ref"):
            return self._log_probs(
                self.ref, batch, r.log_prob_micro_batch_size_per_gpu, r.log_prob_use_dynamic_bsz,
                r.log_prob_max_token_len_per_gpu,
            )

    def update_actor(self, shard: Batch, n_mini_batches: int) -> dict[str, float]:
        settings = UpdateSettings(
            temperature=self.cfg.actor_rollout_ref.rollout.temperature,
            max_response_length=self.cfg.data.max_response_length,
            n_mini_batches=n_mini_batches,
            device=self.device,
        )
        with self._phase("update_actor"), optimizer_state_on(self.optimizer, self.device, self.optimizer_offload):
            metrics = update_policy(self.actor, self.optimizer, shard, self.cfg.actor_rollout_ref.actor, settings, self.dp)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        # this worker's peak GPU memory in each phase since the step's reshard (none on CPU)
        return {**metrics, **worker_figures(self.memory.take()), **span_figures(self.spans.take())}

    def counted(self, method: str, *args: Any) -> tuple[Any, WorkCounts]:
        """``method(*args)`` and the work it dispatched in this worker (trainer/work_counts.py): what
        the driver calls instead of ``method`` while it counts a phase (WorkerGroup.counting)."""
        return count_work(lambda: getattr(self, method)(*args))

    # -- state --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Model and optimizer state on the CPU, in the model's own parameter names.

        Under FSDP this gathers the shards: every worker must call it (WorkerGroup.all); rank 0
        returns the whole state and the others an empty dict. Checkpoints do not gather: see
        ``save_shard``.
        """
        if self.strategy == "fsdp2":
            model = full_model_state(self.actor.lm)
            optimizer = optimizer_state(self.actor, self.optimizer)
            return {"model": model, "optimizer": optimizer} if self.rank == 0 else {}
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.actor.lm.state_dict().items()},
            "optimizer": _to_cpu(self.optimizer.state_dict()),
        }

    def save_shard(self, directory: str) -> list[dict[str, Any]]:
        """Write this worker's shard of the actor's model and optimizer state into ``directory`` (the
        checkpoint's temporary directory); returns each file's description (trainer/workers/shard_state.py).
        Under dp the replicas are equal, so rank 0 alone writes and the others return none."""
        if self.strategy == "dp" and self.rank > 0:
            return []
        return save_shard(Path(directory), self.world_size, self.rank, self.actor, self.optimizer)

    def verify_files(self, files: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """Check each (path, {bytes, sha256}) against its manifest entry; returns what is wrong, by file."""
        problems = []
        for path, info in files:
            try:
                check_file(Path(path), info)
            except CheckpointError as exc:
                problems.append(str(exc))
        return problems

    def load_shards(self, sources: list[tuple[str, dict[str, Any]]]) -> str | None:
        """Fill the actor and its optimizer from shard files (path, tensor spans), verified already;
        returns what is wrong (a tensor missing, of another shape), or None."""
        try:
            load_shards(self.actor, self.optimizer, ShardSources([(Path(path), spans) for path, spans in sources]))
        except CheckpointError as exc:
            return str(exc)
        if self.optimizer_offload:
            move_optimizer_state(self.optimizer, torch.device("cpu"))
        self.engine.sync_from(self.actor.lm)
        return None

    def load_state(self, state: dict[str, Any]) -> None:
        if self.strategy == "fsdp2":
            load_full_model_state(self.actor.lm, state["model"])
            load_optimizer_state(self.actor, self.optimizer, state["optimizer"])
            if self.optimizer_offload:
                move_optimizer_state(self.optimizer, torch.device("cpu"))
        else:
            self.actor.lm.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.engine.sync_from(self.actor.lm)

    def shutdown(self) -> None:
        self.dp.shutdown()  # closes the rendezvous it was handed


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
