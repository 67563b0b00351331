"""One training worker: the actor, the reference and the rollout engine, colocated in one process.

Run as a Ray actor (see trainer/worker_group.py). Each worker holds a full replica of the weights
and its shard of every batch; the workers form one torch.distributed group for gradient sums.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

from trainer.actor import UpdateSettings, compute_log_probs, update_policy
from trainer.batch import Batch
from trainer.config import Config
from trainer.distributed import DataParallel, free_port
from trainer.models import build_model, load_tokenizer, resolve_dtype
from trainer.rollout import make_engine
from trainer.rollout.base import SamplingParams


class TrainWorker:
    def __init__(self, cfg: Config, rank: int, world_size: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        on_gpu = cfg.trainer.device == "cuda"
        if on_gpu and not torch.cuda.is_available():
            raise RuntimeError(f"worker {rank}: trainer.device=cuda but torch sees no GPU in this process")
        self.device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
        if not on_gpu:
            # Ray pins actors to one thread; a CPU worker may use its node's share of the cores.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.trainer.n_gpus_per_node))
        self.dp = DataParallel(rank, world_size, self.device)
        self.actor: torch.nn.Module | None = None
        self.ref: torch.nn.Module | None = None

    # -- set-up -------------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group (its node's IP and a free port)."""
        ip = socket.gethostbyname(socket.gethostname()) if self.cfg.trainer.nnodes > 1 else "127.0.0.1"
        return ip, free_port("0.0.0.0" if self.cfg.trainer.nnodes > 1 else "127.0.0.1")

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        cfg = self.cfg
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.dp.init(master_addr, master_port, backend)
        arr = cfg.actor_rollout_ref
        path = arr.model.path
        dtype = resolve_dtype(arr.actor.fsdp_config.model_dtype, cfg.trainer.device)
        # Every rank builds the same seeded weights, so the replicas start identical.
        self.actor = build_model(path, dtype=dtype, device=self.device, seed=cfg.trainer.seed)
        if arr.model.enable_gradient_checkpointing:
            self.actor.gradient_checkpointing_enable()
        optim = arr.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.actor.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
        )
        if cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
            ref_dtype = resolve_dtype(arr.ref.fsdp_config.model_dtype, cfg.trainer.device)
            self.ref = build_model(path, dtype=ref_dtype, device=self.device, seed=cfg.trainer.seed)
            self.ref.requires_grad_(False).eval()
        self.tokenizer = load_tokenizer(path)
        self.engine = make_engine(arr.rollout.name, self.actor, self.tokenizer, arr.rollout)
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "threads": torch.get_num_threads(),
        }

    # -- phases -------------------------------------------------------------------------------
    def reshard(self) -> None:
        """Hand the actor's current weights to the rollout engine."""
        self.engine.sync_from(self.actor)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def generate(self, prompts: list[list[int]], uids: list[int], ground_truths: list[str], seed: int) -> Batch:
        rollout = self.cfg.actor_rollout_ref.rollout
        sampling = SamplingParams(
            temperature=rollout.temperature, top_k=rollout.top_k, top_p=rollout.top_p, do_sample=rollout.do_sample
        )
        batch = self.engine.generate(
            prompts, uids, ground_truths, rollout.n, self.cfg.data.max_response_length, sampling, seed
        )
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
        return self._log_probs(
            self.actor, batch, r.log_prob_micro_batch_size_per_gpu, r.log_prob_use_dynamic_bsz, r.log_prob_max_token_len_per_gpu
        )

    def compute_ref_log_prob(self, batch: Batch) -> torch.Tensor:
        if self.ref is None:
            raise RuntimeError("the reference model was not built: neither use_kl_loss nor use_kl_in_reward is set")
        r = self.cfg.actor_rollout_ref.ref
        return self._log_probs(
            self.ref, batch, r.log_prob_micro_batch_size_per_gpu, r.log_prob_use_dynamic_bsz, r.log_prob_max_token_len_per_gpu
        )

    def update_actor(self, shard: Batch, n_mini_batches: int) -> dict[str, float]:
        settings = UpdateSettings(
            temperature=self.cfg.actor_rollout_ref.rollout.temperature,
            max_response_length=self.cfg.data.max_response_length,
            n_mini_batches=n_mini_batches,
            device=self.device,
        )
        metrics = update_policy(self.actor, self.optimizer, shard, self.cfg.actor_rollout_ref.actor, settings, self.dp)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return metrics

    # -- state --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Model and optimizer state on the CPU (replicas are identical: rank 0's is the model's)."""
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.actor.state_dict().items()},
            "optimizer": _to_cpu(self.optimizer.state_dict()),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.engine.sync_from(self.actor)

    def shutdown(self) -> None:
        self.dp.shutdown()


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
