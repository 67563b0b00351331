"""The GRPO trainer: one training step read top to bottom, each phase a method timed under its key.

The driver (this process) holds the data, the reward and the advantage computation; the workers hold
the models. ``train_step`` is the whole data flow of one step; every phase method can also be called
on its own (the benchmark suites time them one by one on a batch that a step produced).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from trainer.algorithms.advantages import compute_advantage
from trainer.algorithms.kl import apply_kl_penalty, make_kl_controller
from trainer.batch import Batch, concat_batches
from trainer.config import Config
from trainer.data.loader import PromptBatch, PromptDataset
from trainer.driver.checkpoint import (
    MANIFEST,
    check_trainer_parts,
    checkpoint_bytes,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainer.driver.checkpoint_lock import CheckpointLock
from trainer.driver.checkpoint_shards import load_shards, shard_files, write_shards
from trainer.driver.response_text import response_texts
from trainer.driver.reward import score_batch, scores_to_token_rewards
from trainer.driver.sharding import balanced_mini_batch_shards, even_split, mini_batch_shards
from trainer.driver.step_figures import BatchTokens, batch_metrics, batch_tokens
from trainer.driver.tracking import Tracking
from trainer.driver.worker_group import WorkerGroup
from trainer.models.presets import load_tokenizer, model_spec
from trainer.phases import CHECKPOINT_BYTES
from trainer.rollout.replay_shares import step_uids
from trainer.rollout.requests import rollout_seed
from trainer.rollout.tensor_parallel import decode_group_size
from trainer.timing import PhaseTimer
from trainer.work_counts import WorkCounts, count_work
from trainer.workers.memory_peaks import largest_worker
from trainer.workers.phase_spans import Span, wait_figures, worker_spans

T = TypeVar("T")
# What update_actor's workers read besides the rows (trainer/workers/actor.py); the log-prob phases
# read the rows alone. Nothing else is shipped to them (Batch.select's only).
UPDATE_INPUTS: tuple[str, ...] = ("old_log_probs", "ref_log_probs", "advantages")


@dataclass
class StepResult:
    """What one step measured: seconds under VERL's timing keys, the work its batch did, and metrics."""

    step: int
    timing_s: dict[str, float]
    metrics: dict[str, float]
    tokens: BatchTokens

    def flat(self) -> dict[str, float]:
        """One flat dict for loggers: timing_s/KEY, the metrics, and tokens/{prompt,response,total,sequences}."""
        out = {f"timing_s/{k}": v for k, v in self.timing_s.items()}
        out.update(self.metrics)
        t = self.tokens
        counts = {"prompt": t.prompt_tokens, "response": t.response_tokens, "total": t.total_tokens,
                  "sequences": t.num_sequences}
        out.update({f"tokens/{k}": float(v) for k, v in counts.items()})
        return out


class GRPOTrainer:
    def __init__(self, cfg: Config, dataset: PromptDataset, tracking: Tracking | None = None) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self.tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
        self.spec = model_spec(cfg.actor_rollout_ref.model.path)
        self.loader = dataset.batches(cfg.data.train_batch_size, cfg.data.seed, shuffle=cfg.data.shuffle)
        kl = cfg.algorithm.kl_ctrl
        self.kl_ctrl = make_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
        self.tracking = tracking
        self.global_step = 0
        self.last_batch: Batch | None = None  # the last train_step's batch, every phase's inputs filled in
        self.worker_spans: list[dict[str, Span]] = []  # each worker's phase spans, from its last update_actor
        # A run that saves holds its checkpoint directory for its lifetime: a second run there fails now.
        saves = cfg.trainer.save_freq > 0
        self.checkpoint_lock = CheckpointLock.acquire(self.checkpoint_root) if saves else None
        try:
            self.workers = WorkerGroup(cfg)
        except BaseException:
            if self.checkpoint_lock is not None:
                self.checkpoint_lock.release()
            raise

    @property
    def uses_ref(self) -> bool:
        return self.cfg.actor_rollout_ref.actor.use_kl_loss or self.cfg.algorithm.use_kl_in_reward

    @property
    def checkpoint_root(self) -> Path:
        return Path(self.cfg.trainer.default_local_dir)

    # ------------------------------------------------------------------ one step, top to bottom
    def train_step(self, prompts: PromptBatch) -> StepResult:
        timer = PhaseTimer()
        with timer.phase("step"):
            with timer.phase("gen"):
                with timer.phase("reshard"):
                    self.reshard()
                with timer.phase("generate_sequences"):
                    batch = self.generate_sequences(prompts)
            with timer.phase("reward"):
                batch = self.compute_reward(batch)
            with timer.phase("old_log_prob"):
                batch.old_log_probs = self.compute_old_log_prob(batch)
            if self.uses_ref:
                with timer.phase("ref"):
                    batch.ref_log_probs = self.compute_ref_log_prob(batch)
            with timer.phase("adv"):
                batch, adv_metrics = self.compute_advantage(batch)
            with timer.phase("update_actor"):
                actor_metrics = self.update_actor(batch)
        self.global_step += 1
        saved: dict[str, float] = {}
        if self.cfg.trainer.save_freq > 0 and self.global_step % self.cfg.trainer.save_freq == 0:
            with timer.phase("save_checkpoint"):
                path = self.save_checkpoint()
            saved[CHECKPOINT_BYTES] = float(checkpoint_bytes(path))  # the save's work, as tokens are a phase's
        self.last_batch = batch
        waits = wait_figures(timer.spans, self.worker_spans)  # the step's time outside the workers' own
        result = StepResult(
            step=self.global_step,
            timing_s=dict(timer.seconds),
            metrics={**batch_metrics(batch), **adv_metrics, **actor_metrics, **waits, **saved},
            tokens=self.batch_tokens(batch),
        )
        return result

    # ------------------------------------------------------------------ phases
    def reshard(self) -> None:
        """Weight sync: the actor's current weights into each worker's rollout engine."""
        self.workers.all("reshard")

    def generate_sequences(self, prompts: PromptBatch) -> Batch:
        """Sample rollout.n responses per prompt; prompts are split evenly over the workers."""
        shards = self.workers.each("generate", self._generate_args(prompts), phase="generate_sequences")
        return concat_batches([s for s in shards if s.size])

    def generate_with(self, engine: str, prompts: PromptBatch) -> Batch:
        """``generate_sequences`` by another registered rollout engine (the rollout panel, see
        docs/fidelity.md): the same prompts, split the same way, with the same uids and seed. Each
        worker builds that engine once over its actor and syncs it from the actor's current weights
        (its reshard) before generating; the session's engine is left as it was."""
        args = [(engine, *part) for part in self._generate_args(prompts)]
        shards = self.workers.each("generate_with", args, phase=f"generate_sequences ({engine})")
        return concat_batches([s for s in shards if s.size])

    def _generate_args(self, prompts: PromptBatch) -> list[tuple[list[list[int]], list[int], list[str], int]]:
        """Each worker's (prompt ids, uids, ground truths, seed): prompts split evenly, a GRPO group per
        prompt of this batch, one seed per step for every worker."""
        seed = self._rollout_seed()
        uids = self._step_uids(prompts, seed)
        return [
            (
                [prompts.input_ids[i] for i in rows],
                [uids[i] for i in rows],
                [prompts.ground_truths[i] for i in rows],
                seed,
            )
            for rows in even_split(len(prompts), self.workers.world_size)
        ]

    def _step_uids(self, prompts: PromptBatch, seed: int) -> list[int]:
        """0 .. B-1, or with rollout.target_lengths.slowest_of the uids of the slowest shares of the run
        replayed (replay_shares.py), ranked at the mean prompt length of the step's prompts."""
        rollout = self.cfg.actor_rollout_ref.rollout
        prompt_length = round(sum(len(ids) for ids in prompts.input_ids) / max(1, len(prompts)))
        return step_uids(
            self.spec.arch, rollout.target_lengths, rollout.n, len(prompts), self.workers.world_size,
            prompt_length, seed, self.cfg.data.max_response_length,
        )

    def batch_tokens(self, batch: Batch) -> BatchTokens:
        """The work in ``batch`` (a generate_sequences result): tokens, lengths and decode steps (a decode
        group of rollout.tensor_model_parallel_size workers decodes its rows together: one replica)."""
        return batch_tokens(batch, self.cfg.actor_rollout_ref.rollout.n, self.workers.world_size, decode_group_size(self.cfg))

    def _rollout_seed(self) -> int:
        """One seed per step for every worker: the static engine keys each row's noise by its uid."""
        return rollout_seed(self.cfg.trainer.seed, self.global_step)

    def compute_reward(self, batch: Batch) -> Batch:
        """Rule-based math reward on the decoded responses, as token-level scores on the last token."""
        texts = response_texts(self.tokenizer, batch.response_ids, batch.response_mask)
        scores = torch.tensor(score_batch(texts, batch.ground_truths), dtype=torch.float32)
        batch.scores = scores
        batch.token_level_scores = scores_to_token_rewards(scores, batch.response_mask)
        return batch

    def training_shards(self, batch: Batch) -> list[list[int]]:
        """Each worker's rows in update_actor, its part of every mini-batch in mini-batch order; with
        trainer.balance_batch (VERL's key, on by default) the parts of each mini-batch hold near-equal
        tokens, and the log-prob phases give every worker these same rows (trainer/driver/sharding.py)."""
        mini_rows = self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size * self.cfg.actor_rollout_ref.rollout.n
        if not self.cfg.trainer.balance_batch:
            return mini_batch_shards(batch.size, mini_rows, self.workers.world_size)
        return balanced_mini_batch_shards(batch.sequence_lengths.tolist(), mini_rows, self.workers.world_size)

    def _log_probs(self, method: str, batch: Batch, phase: str) -> torch.Tensor:
        if self.cfg.trainer.balance_batch:
            parts = self.training_shards(batch)
        else:
            parts = even_split(batch.size, self.workers.world_size)
        outs = self.workers.each(method, [(batch.select(rows, only=()),) for rows in parts], phase=phase)
        width = batch.response_ids.shape[1]
        order = torch.tensor([row for rows in parts for row in rows])
        padded = torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1])) for o in outs])
        return padded[torch.argsort(order)]  # back to the batch's row order

    def compute_old_log_prob(self, batch: Batch) -> torch.Tensor:
        return self._log_probs("compute_old_log_prob", batch, "old_log_prob")

    def compute_ref_log_prob(self, batch: Batch) -> torch.Tensor:
        return self._log_probs("compute_ref_log_prob", batch, "ref")

    def compute_advantage(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        alg = self.cfg.algorithm
        metrics: dict[str, float] = {}
        if alg.use_kl_in_reward:
            out = apply_kl_penalty(
                batch.token_level_scores, batch.old_log_probs, batch.ref_log_probs, batch.response_mask,
                self.kl_ctrl, alg.kl_penalty,
            )
            batch.token_level_rewards = out.token_level_rewards
            metrics.update(out.metrics)
        else:
            batch.token_level_rewards = batch.token_level_scores
        batch.advantages, batch.returns = compute_advantage(
            alg.adv_estimator,
            token_level_rewards=batch.token_level_rewards,
            response_mask=batch.response_mask,
            index=batch.uids.tolist(),
            gamma=alg.gamma,
            lam=alg.lam,
            norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
        )
        return batch, metrics

    def update_actor(self, batch: Batch) -> dict[str, float]:
        """One PPO update; each worker gets its part of every mini-batch (see trainer/driver/sharding.py)."""
        mini_rows = self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size * self.cfg.actor_rollout_ref.rollout.n
        shards = self.training_shards(batch)
        parts = [batch.select(rows, only=UPDATE_INPUTS) for rows in shards]
        returned = self.workers.each("update_actor", [(part, batch.size // mini_rows) for part in parts])
        self.worker_spans, metrics = map(list, zip(*(worker_spans(m) for m in returned), strict=True))
        # every worker reports the same global figures; its peak GPU memory is its own
        return {**metrics[0], **largest_worker(metrics)}

    def count_work(self, fn: Callable[[], T]) -> tuple[T, WorkCounts]:
        """``fn()`` (a phase, or several) and the work it dispatched, here and in every worker it called
        (trainer/work_counts.py): deterministic where the phase is, whatever the machine's speed."""
        with self.workers.counting() as shares:
            result, here = count_work(fn, device=False)  # the GPU work is the workers', counted there
        return result, sum(shares, here)

    # ------------------------------------------------------------------ loop and state
    def total_steps(self) -> int:
        if self.cfg.trainer.total_training_steps is not None:
            return self.cfg.trainer.total_training_steps
        return self.cfg.trainer.total_epochs * self.loader.batches_per_epoch

    def fit(self) -> list[StepResult]:
        results = []
        while self.global_step < self.total_steps():
            result = self.train_step(next(self.loader))
            results.append(result)
            if self.tracking is not None:
                self.tracking.log(result.step, result.flat())
        return results

    def save_checkpoint(self) -> Path:
        """The driver's counters as ``trainer.pt``; each worker writes its own shard of the actor's
        model and optimizer state beside it, in parallel (trainer/driver/checkpoint_shards.py)."""
        driver = {
            "global_step": self.global_step,
            "loader": self.loader.state_dict(),
            "kl_coef": self.kl_ctrl.value,
        }
        meta = {"config": json.loads(json.dumps(dataclasses.asdict(self.cfg), default=str)), "model": self.spec.to_dict()}
        keep = self.cfg.trainer.max_actor_ckpt_to_keep
        return save_checkpoint(
            self.checkpoint_root, self.global_step, {"trainer": driver}, meta, keep,
            write_shards=lambda directory: write_shards(self.workers, directory),
        )

    def load_checkpoint(self, path: str | Path | None = None) -> int:
        """Resume from ``path`` or the latest checkpoint; returns the step resumed at (0: none)."""
        target = Path(path) if path is not None else latest_checkpoint(self.checkpoint_root)
        if target is None:
            return 0
        parts, manifest = load_checkpoint(target, hash_shards=False)  # the workers hash the shards
        check_trainer_parts(manifest, parts, target / MANIFEST)
        shards = shard_files(manifest, target / MANIFEST)
        if shards:
            load_shards(self.workers, target, shards, manifest["files"])
        else:  # format 1: the model and optimizer were saved whole, gathered by the driver
            state = {"model": parts["model"], "optimizer": parts["optimizer"]}
            self.workers.all("load_state", state, phase="load_checkpoint")
        driver = parts["trainer"]
        self.global_step = int(driver["global_step"])
        self.loader.load_state_dict(driver["loader"])
        self.kl_ctrl.value = float(driver["kl_coef"])
        return self.global_step

    def resume(self) -> int:
        mode = self.cfg.trainer.resume_mode
        if mode == "auto":
            return self.load_checkpoint()
        if mode == "resume_path":
            return self.load_checkpoint(self.cfg.trainer.resume_from_path)
        return 0

    def shutdown(self) -> None:
        self.workers.shutdown()
        if self.checkpoint_lock is not None:
            self.checkpoint_lock.release()
        if self.tracking is not None:
            self.tracking.close()
