"""Tensor-parallel decoding for the fast engine (actor_rollout_ref.rollout.tensor_model_parallel_size = t).

t consecutive workers form one decode group, as a VERL rollout replica of t GPUs does (its vLLM
engine at tensor_parallel_size t). The split is Megatron-LM's (Shoeybi et al. 2019, arXiv:1909.08053,
section 3):
- each GPU holds 1/t of every layer's attention heads (the rows of q, k and v, the columns of o) and
  of its MLP's intermediate width (the rows of gate and up, the columns of down); the embedding, the
  norms and the LM head are whole on every GPU;
- o and down give partial sums, which one all-reduce each adds over the group (two a layer), so every
  GPU holds the same hidden state and computes the same logits;
- the group decodes all of its workers' rows together: each worker's prompts are gathered, decoded
  once, and each worker keeps its own rows.

Why: a decode step at a small batch is bound by what it reads, and at 7B the weights are most of it.
Decoding on its own, each GPU reads all the weights for its rows; in a group of t, each reads 1/t of
the layers' weights for t times the rows, and the K/V it reads is unchanged (1/t of the heads of t
times the rows).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainer.batch import Batch
from trainer.config.validation import TP_KEY
from trainer.rollout.registry import engine_class

if TYPE_CHECKING:
    from trainer.config import Config

REDUCE_ENV = "RLBENCH_TP_REDUCE"  # how a CUDA decode group sums: reduce_from_env
REDUCES = ("nccl", "one_shot")
ONE_SHOT_BYTES = 4 << 20  # the one-shot buffer: larger sums (prefill's) go through NCCL

# A source parameter's name ending -> the dimension split over the group (absent: whole on each GPU).
SPLIT_DIM: dict[str, int] = {
    "self_attn.q_proj.weight": 0,
    "self_attn.k_proj.weight": 0,
    "self_attn.v_proj.weight": 0,
    "self_attn.q_proj.bias": 0,
    "self_attn.k_proj.bias": 0,
    "self_attn.v_proj.bias": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.gate_proj.weight": 0,
    "mlp.up_proj.weight": 0,
    "mlp.down_proj.weight": 1,
}


def split_dim(name: str) -> int | None:
    """The dimension of parameter ``name`` that the group splits, or None where each GPU holds it whole."""
    for ending, dim in SPLIT_DIM.items():
        if name.endswith(ending):
            return dim
    return None


def local_part(name: str, whole: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This GPU's part of parameter ``name``: its 1/size slice along the split dimension, or all of it."""
    dim = split_dim(name)
    if dim is None or size == 1:
        return whole
    return whole.chunk(size, dim=dim)[rank]


def decode_group_size(cfg: Config) -> int:
    """Workers per decode group: rollout.tensor_model_parallel_size where the engine decodes
    tensor-parallel (its supports_tensor_parallel trait), else 1 (the key has no effect there)."""
    rollout = cfg.actor_rollout_ref.rollout
    return int(rollout.tensor_model_parallel_size) if engine_class(rollout.name).supports_tensor_parallel else 1


def decode_groups(world_size: int, size: int) -> list[list[int]]:
    """The ranks of each decode group: ``size`` consecutive workers ([0, 1], [2, 3], ... at size 2)."""
    if size < 1 or world_size % size:
        raise ValueError(f"{TP_KEY}={size} must be >= 1 and divide the {world_size} worker(s)")
    return [list(range(start, start + size)) for start in range(0, world_size, size)]


@dataclass(frozen=True)
class DecodeGroup:
    """This worker's place in its decode group, and the group's collectives (on the group)."""

    rank: int  # within the group
    size: int
    group: Any  # torch.distributed ProcessGroup
    one_shot: OneShotReduce | None = None  # sums that fit it go through symmetric memory (with_one_shot)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the group (capturable in a CUDA graph): a new tensor from the one-shot
        kernel where ``t`` fits its buffer, else ``t`` itself, summed in place by NCCL."""
        if self.one_shot is not None and self.one_shot.fits(t):
            return self.one_shot(t)
        dist.all_reduce(t, group=self.group)
        return t

    def with_one_shot(self, device: torch.device, dtype: torch.dtype, capacity_bytes: int = ONE_SHOT_BYTES) -> DecodeGroup:
        """This group with a one-shot buffer (a collective: every member calls it, before any capture)."""
        return replace(self, one_shot=OneShotReduce(self.group, capacity_bytes // dtype.itemsize, dtype, device))

    def broadcast_(self, t: torch.Tensor) -> torch.Tensor:
        """Overwrite ``t`` with the group's first member's, in place; return it."""
        dist.broadcast(t, group=self.group, group_src=0)
        return t

    def gather(self, item: Any) -> list[Any]:
        """Every member's ``item`` (picklable), in group order."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, item, group=self.group)
        return out


class OneShotReduce:
    """Sums over a decode group of one host through PyTorch's symmetric memory: each GPU's kernel
    copies its values into a buffer its peers can read over NVLink and adds theirs, in one launch
    (``torch.ops.symm_mem.one_shot_all_reduce_copy``). At a decode step's sizes (tens to hundreds of KB)
    NCCL's all-reduce is bound by its latency, and a step holds two a layer.

    The buffer is allocated and exchanged here (a collective, which cannot run inside a CUDA-graph
    capture); later calls only launch the kernel, which a graph captures. Multicast is off
    (TORCH_SYMM_MEM_DISABLE_MULTICAST): the one-shot kernel reads peers through plain P2P pointers, and
    building a multicast object fails on some hosts.
    """

    def __init__(self, group: Any, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        from torch.distributed import _symmetric_memory as symm_mem

        self.group_name: str = group.group_name
        self.buffer = symm_mem.empty(capacity, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)

    def fits(self, t: torch.Tensor) -> bool:
        b = self.buffer
        return t.dtype == b.dtype and t.device == b.device and t.is_contiguous() and t.numel() <= b.numel()

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        # the kernel's output has the input's shape, and so must the buffer view it copies into
        view = self.buffer[: t.numel()].view_as(t)
        return torch.ops.symm_mem.one_shot_all_reduce_copy(view, t, "sum", self.group_name)


def reduce_from_env(environ: Mapping[str, str] | None = None) -> str:
    """How a CUDA decode group sums its split matmuls: REDUCE_ENV, "nccl" (the default) or "one_shot"."""
    value = (os.environ if environ is None else environ).get(REDUCE_ENV, "nccl")
    if value not in REDUCES:
        raise ValueError(f"{REDUCE_ENV} must be one of {', '.join(REDUCES)}, got {value!r}")
    return value


def join_decode_group(rank: int, world_size: int, size: int) -> DecodeGroup | None:
    """This worker's decode group of ``size`` (None at 1). Every worker must call it, in the same
    order, after torch.distributed is initialised: each group is made by all ranks together."""
    if size == 1:
        return None
    mine: DecodeGroup | None = None
    for ranks in decode_groups(world_size, size):
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = DecodeGroup(ranks.index(rank), size, group)
    assert mine is not None
    return mine


def own_rows(batch: Batch, start: int, count: int) -> Batch:
    """Rows [start, start + count) of a group's generated batch, trimmed to their own widths: the
    prompt columns where any of them has a token (prompts are left-padded), the response columns up
    to their longest response. So a worker gets the Batch it would have generated on its own."""
    rows = batch.select(list(range(start, start + count)))
    prompt_width = int(rows.prompt_mask.sum(dim=1).max()) if count else 0
    response_width = int(rows.response_mask.sum(dim=1).max()) if count else 0
    p0 = rows.prompt_ids.shape[1] - prompt_width
    trimmed = {
        "prompt_ids": rows.prompt_ids[:, p0:].contiguous(),
        "prompt_mask": rows.prompt_mask[:, p0:].contiguous(),
        "response_ids": rows.response_ids[:, :response_width].contiguous(),
        "response_mask": rows.response_mask[:, :response_width].contiguous(),
    }
    for name in ("rollout_log_probs", "rollout_entropies"):
        value = getattr(rows, name)
        if value is not None:
            trimmed[name] = value[:, :response_width].contiguous()
    return replace(rows, **trimmed)


def row_starts(prompt_counts: Sequence[int], n: int) -> list[int]:
    """Where each member's rows start in the group's batch (members in order, n rows a prompt)."""
    starts, at = [], 0
    for count in prompt_counts:
        starts.append(at)
        at += count * n
    return starts
