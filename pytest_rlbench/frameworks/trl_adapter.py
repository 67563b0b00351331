"""TRL's ``GRPOTrainer`` behind the bundled trainer's phase methods, each phase timed inside TRL.

One step (``train_step``) is one real TRL step: ``GRPOTrainer.training_step`` for each micro-batch
of the generation (its first call generates, scores and computes the log-probs in
``_generate_and_score_completions``; every call computes the loss and runs backward), and after
every ``gradient_accumulation_steps`` calls the optimizer step as transformers' ``Trainer._run_epoch``
does it (``_clip_grad_norm``, ``optimizer.step``, ``lr_scheduler.step``, ``zero_grad``). Nothing of
TRL is reimplemented: its own methods are wrapped on the instance and timed with
``trainer.timing.PhaseTimer`` (device-synchronised), under VERL's keys:

- gen: ``_generate``; reward: ``_calculate_rewards``;
- old_log_prob / ref: ``_get_per_token_logps_and_entropies`` on the policy / the reference model,
  called from ``_generate_and_score_completions`` (TRL computes the old log-probs only when a
  generation feeds more than one optimizer step; else it is absent);
- update_actor: ``compute_loss`` and ``accelerator.backward`` of every micro-batch, and the optimizer
  steps; step: all of it.

The phase benchmarks call the same TRL methods again on what the last step captured (the suites
time our phases on the warm-up step's batch the same way). Phases TRL does not separate are in
``absent_phases``, with the reason; the plugin skips them and reports them as absent
(``pytest_rlbench/frameworks/phase_skips.py``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pytest_rlbench.frameworks.trl_settings import TRLPlan, trl_plan
from trainer.batch import right_pad
from trainer.config import Config
from trainer.data.loader import PromptBatch, PromptDataset, PromptRow
from trainer.driver.grpo_trainer import StepResult
from trainer.driver.reward import score_batch, scores_to_token_rewards
from trainer.driver.step_figures import BatchTokens, tokens_from_lengths
from trainer.models.presets import is_preset, load_tokenizer, resolve_dtype, save_preset
from trainer.timing import PhaseTimer

ABSENT = "trl does not separate {phase}: {why}"


def math_reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
    """trainer/driver/reward.py's rule-based math score, in TRL's reward-function signature."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return score_batch(texts, ground_truth)


@dataclass
class TRLRollout:
    """One generation as TRL's ``_generate`` returned it (one entry per response), padded for the
    suites' shape checks; ``token_level_scores`` is set by ``compute_reward``."""

    prompts: list[Any]
    inputs: list[dict[str, Any]]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    completions: list[Any]
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    token_level_scores: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self.completion_ids)


class TRLAdapter:
    """TRL's GRPOTrainer on the session's model, data, reward and batch; the suites' trainer interface."""

    def __init__(self, cfg: Config, dataset: PromptDataset, workdir: Path) -> None:
        import datasets
        import trl

        if cfg.world_size != 1:  # the record's per-GPU figures would divide by workers TRL never had
            raise ValueError(
                f"--rl-trainer trl runs one process, found {cfg.world_size} workers (trainer.nnodes x "
                "trainer.n_gpus_per_node): set --rl-nodes 1 and one GPU (--rl-gpus-per-node 1) or, on CPU, "
                "--rl-config trainer.n_gpus_per_node=1"
            )
        self.cfg = cfg
        self.dataset = dataset
        self.framework = f"trl {trl.__version__}"
        dtype = resolve_dtype(cfg.actor_rollout_ref.actor.fsdp_config.model_dtype, cfg.trainer.device)
        self.plan: TRLPlan = trl_plan(cfg, str(workdir / "trl"), str(dtype).removeprefix("torch."))
        self.differences = list(self.plan.differences)
        if dataset.truncated_rows:
            self.differences.append(
                f"{len(dataset.truncated_rows)} prompt(s) truncated by ours ({dataset.truncation}); trl "
                "tokenizes the whole conversation"
            )
        self.tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
        rows = [self._row(p) for p in dataset.prompts]
        self.trl = trl.GRPOTrainer(
            model=self._model_dir(workdir),
            reward_funcs=[math_reward],
            args=trl.GRPOConfig(**self.plan.args),
            train_dataset=datasets.Dataset.from_list(rows),
            processing_class=self.tokenizer,
        )
        self.trl.create_optimizer_and_scheduler(num_training_steps=1_000_000)
        self.loader = dataset.batches(cfg.data.train_batch_size, cfg.data.seed, shuffle=cfg.data.shuffle)
        self.global_step = 0
        self.last_batch: TRLRollout | None = None
        self._timer: PhaseTimer | None = None  # set while a step runs: TRL's methods time into it
        self._in_update = False  # inside compute_loss: its policy forward is part of update_actor
        self._captured: dict[str, Any] = {}
        self._instrument()

    # ------------------------------------------------------------------ set-up
    def _model_dir(self, workdir: Path) -> str:
        """A directory TRL can load policy and reference from: a preset is saved with the seeded
        weights our workers build (trainer.seed), a model directory is used as it is."""
        path = self.cfg.actor_rollout_ref.model.path
        if not is_preset(path):
            return path
        return str(save_preset(path, workdir / f"trl-model-{path}", seed=self.cfg.trainer.seed))

    def _instrument(self) -> None:
        t = self.trl
        t._generate = self._timed("gen", self._capturing("generate", t._generate))
        t._calculate_rewards = self._timed("reward", self._capturing("reward", t._calculate_rewards))
        t._get_per_token_logps_and_entropies = self._log_probs(t._get_per_token_logps_and_entropies)
        t.compute_loss = self._timed("update_actor", self._update_part(t.compute_loss))
        t.accelerator.backward = self._timed("update_actor", self._update_part(t.accelerator.backward))

    def _timed(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if self._timer is None or self._in_update and key != "update_actor":
                return fn(*args, **kwargs)
            with self._timer.phase(key):
                return fn(*args, **kwargs)

        return run

    def _capturing(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if self._timer is not None:  # a step's call: what the phase benchmarks replay
                self._captured[name] = (args, kwargs, out)
            return out

        return run

    def _update_part(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            outer, self._in_update = self._in_update, True
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_update = outer

        return run

    def _log_probs(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Log-probs outside the loss: of the reference model (ref) or of the policy (old_log_prob)."""

        @functools.wraps(fn)
        def run(model: Any, *args: Any, **kwargs: Any) -> Any:
            if self._in_update:
                return fn(model, *args, **kwargs)
            key = "ref" if model is self.trl.ref_model else "old_log_prob"
            return self._timed(key, self._capturing(key, fn))(model, *args, **kwargs)

        return run

    # ------------------------------------------------------------------ one step, top to bottom
    @property
    def uses_ref(self) -> bool:
        return self.trl.beta != 0.0

    @property
    def absent_phases(self) -> dict[str, str]:
        """Phase key -> why TRL has no separate time for it (the suites skip those phases)."""
        out = {
            "reshard": ABSENT.format(phase="reshard", why="its transformers generation samples from the "
                                     "training model itself, no weight sync"),
            "generate_sequences": ABSENT.format(phase="generate_sequences", why="its gen is _generate alone"),
            "adv": ABSENT.format(phase="adv", why="advantages are computed inline in "
                                 "_generate_and_score_completions"),
            "save_checkpoint": ABSENT.format(phase="save_checkpoint", why="checkpoints are not adapted yet"),
        }
        if not self.plan.computes_old_log_prob:
            out["old_log_prob"] = ABSENT.format(
                phase="old_log_prob", why="a generation feeding one optimizer step reuses the detached "
                "current log-probs (_generate_and_score_completions)"
            )
        return out

    def train_step(self, prompts: PromptBatch) -> StepResult:
        inputs = self._inputs(prompts)
        timer = PhaseTimer()
        self._timer, self._captured = timer, {}
        t = self.trl
        t.current_gradient_accumulation_steps = self.plan.grad_accum
        try:
            with timer.phase("step"):
                count = self.plan.micro_steps * t.num_iterations
                norms = self._accumulate(lambda _: t.training_step(t.model, inputs, None), count)
        finally:
            self._timer = None
        self.global_step += 1
        self.last_batch = self._rollout(self._captured["generate"][2], inputs)
        scores = self._weighted_scores(self._captured["reward"][2])
        metrics = {"actor/grad_norm": norms[-1], "critic/score/mean": float(scores.mean())}
        return StepResult(self.global_step, dict(timer.seconds), metrics, self.batch_tokens(self.last_batch))

    def _accumulate(self, micro_step: Callable[[int], Any], count: int) -> list[float]:
        """``count`` micro-batches (``micro_step(i)`` each), the optimizer stepped after every
        ``gradient_accumulation_steps`` of them; the gradient norm of each optimizer step."""
        norms = []
        for i in range(count):
            micro_step(i)
            if (i + 1) % self.plan.grad_accum == 0:
                norms.append(self._optimizer_step())
        return norms

    def _weighted_scores(self, per_func: torch.Tensor) -> torch.Tensor:
        """Each response's reward as TRL's _generate_and_score_completions sums it: every reward
        function's column times its ``reward_weights`` entry, NaN (no score) counting as 0."""
        return (per_func * self.trl.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1).float().cpu()

    def _optimizer_step(self) -> float:
        """transformers' Trainer._run_epoch after the accumulated micro-batches: clip, step, zero."""
        t = self.trl
        timer = self._timer
        with timer.phase("update_actor") if timer else contextlib.nullcontext():
            norm = t._clip_grad_norm(t.model) if t.args.max_grad_norm > 0 else None
            norm = t._get_grad_norm(t.model, grad_norm=norm)
            t.optimizer.step()
            t.lr_scheduler.step()
            t.model.zero_grad()
            t.state.global_step += 1
        return float(norm)

    def _inputs(self, prompts: PromptBatch) -> list[dict[str, Any]]:
        """TRL's generation batch: each prompt's row ``num_generations`` times in a row, as its
        RepeatSampler orders them."""
        n = self.plan.args["num_generations"]
        rows = [self._row(p) for p in prompts.prompts]
        return [row for row in rows for _ in range(n)]

    def _row(self, prompt: PromptRow) -> dict[str, Any]:
        """A data set row as TRL reads it: the conversation (the messages our loader templated, from
        whichever train file the prompt came), and the reward's ground truth column."""
        return {"prompt": [dict(m) for m in prompt.messages], "ground_truth": prompt.ground_truth}

    def _rollout(self, out: tuple[Any, ...], inputs: list[dict[str, Any]]) -> TRLRollout:
        """The suites' view of what ``_generate`` returned for ``inputs``."""
        prompt_ids, completion_ids, _, completions = out[:4]
        ids, mask = right_pad(completion_ids, self.tokenizer.pad_token_id)  # as TRL pads completions
        prompts = [row["prompt"] for row in inputs]
        return TRLRollout(prompts, inputs, prompt_ids, completion_ids, completions, ids, mask)

    # ------------------------------------------------------------------ phases, replayed on TRL's methods
    def reshard(self) -> None:
        """No weight sync in TRL's transformers generation: gen is _generate alone (see absent_phases)."""

    def generate_sequences(self, prompts: PromptBatch) -> TRLRollout:
        inputs = self._inputs(prompts)
        with torch.no_grad():
            out = self.trl._generate([row["prompt"] for row in inputs])
        return self._rollout(out, inputs)

    def batch_tokens(self, batch: TRLRollout) -> BatchTokens:
        response = [len(ids) for ids in batch.completion_ids]
        # one process decodes the whole batch: as many decode steps as its longest response
        return tokens_from_lengths([len(ids) for ids in batch.prompt_ids], response, max(response, default=0))

    def compute_reward(self, batch: TRLRollout) -> TRLRollout:
        per_func = self.trl._calculate_rewards(
            batch.inputs, batch.prompts, batch.completions, batch.completion_ids
        )
        batch.token_level_scores = scores_to_token_rewards(self._weighted_scores(per_func), batch.response_mask)
        return batch

    def _replay_log_probs(self, key: str) -> torch.Tensor:
        args, kwargs, _ = self._last[key]
        with torch.no_grad():
            logps, _, _ = self.trl._get_per_token_logps_and_entropies(*args, **kwargs)
        return logps

    def compute_old_log_prob(self, batch: TRLRollout) -> torch.Tensor:
        return self._replay_log_probs("old_log_prob")

    def compute_ref_log_prob(self, batch: TRLRollout) -> torch.Tensor:
        return self._replay_log_probs("ref")

    def update_actor(self, batch: TRLRollout) -> dict[str, float]:
        """TRL's update on the last step's micro-batches: what training_step does after its
        _prepare_inputs (compute_loss, the loss scaled for accumulation, backward), then the
        optimizer steps."""
        t = self.trl
        t.model.train()
        micro_batches = list(t._buffered_inputs) * t.num_iterations

        def loss_backward(i: int) -> None:
            with t.compute_loss_context_manager():
                loss = t.compute_loss(t.model, micro_batches[i])
            t.accelerator.backward(loss / self.plan.grad_accum)

        return {"actor/grad_norm": self._accumulate(loss_backward, len(micro_batches))[-1]}

    def save_checkpoint(self) -> Path:
        raise NotImplementedError(self.absent_phases["save_checkpoint"])

    def shutdown(self) -> None:
        self._captured = {}
        self.last_batch = None

    @property
    def _last(self) -> dict[str, Any]:
        if not self._captured:
            raise RuntimeError("no TRL step has run yet: the phase replays need one (the rl_batch fixture)")
        return self._captured


