"""The actor's and reference's training wrapper, and FSDP2 over the worker group.

``PolicyModel`` wraps a causal LM so that one forward returns what the actor needs, the log-probs of
the response tokens (and their entropy), straight from the final hidden states: the LM head and the
log-softmax run in token chunks (trainer/kernels/head_logprobs.py), so the [tokens, vocab] logits of a
micro-batch never exist whole. FSDP2 (``torch.distributed.fsdp.fully_shard``) shards every decoder
layer and, as the root, the wrapper (embeddings, final norm, LM head); calling the root's forward
is what gathers those root parameters, which is why the head's math lives in the wrapper's forward.

Strategies (actor_rollout_ref.actor.strategy): ``fsdp2`` over all workers, one worker included
(a process group of one); ``dp``, a full replica per worker with one flat gradient all-reduce per
mini-batch (trainer/workers/distributed.py); ``auto`` is fsdp2 on GPU and dp on CPU.

Gradients: the actor's loss weights already make the sum over micro-batches and workers equal the
global mini-batch's loss (trainer/workers/actor.py), so FSDP must sum gradients, not average them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.algorithms.entropy import logprobs_from_hidden
from trainer.batch import PACK_MIN_PADDING, left_justify, pack_rows, packing_pays
from trainer.models.layers import decoder_layers
from trainer.models.packed_attention import packed_call_kwargs, rows_attend_alone, use_packed_attention

STRATEGIES: tuple[str, ...] = ("fsdp2", "dp")


def resolve_strategy(name: str, device_type: str) -> str:
    """``auto`` is fsdp2 on GPU and dp on CPU; the others are returned as they are."""
    if name == "auto":
        return "fsdp2" if device_type == "cuda" else "dp"
    if name not in STRATEGIES:
        raise ValueError(f"actor strategy: expected one of auto, {', '.join(STRATEGIES)}; found {name!r}")
    return name


def compute_dtype(param_dtype: torch.dtype, device_type: str) -> torch.dtype:
    """What the forward computes in: bf16 on GPU for fp32 master weights (VERL's mixed precision),
    else the parameters' own dtype."""
    if device_type == "cuda" and param_dtype == torch.float32:
        return torch.bfloat16
    return param_dtype


class PolicyModel(nn.Module):
    """A causal LM whose forward gives response-token log-probs [B, R] (float32), and entropy if asked.

    ``packed`` (VERL's use_remove_padding): the forward runs a micro-batch's rows end to end with no
    padding (trainer/models/packed_attention.py) where padding would add enough work to pay for it
    (trainer.batch.packing_pays) or where the rows are long enough to attend one at a time on the GPU
    (packed_attention.rows_attend_alone: no padding then costs nothing); otherwise on the rows
    left-justified and padded.
    """

    def __init__(self, lm: nn.Module, packed: bool = False, pack_min_padding: float = PACK_MIN_PADDING) -> None:
        super().__init__()
        self.lm = lm
        self.packed = packed
        self.pack_min_padding = pack_min_padding  # 0: pack every micro-batch (benchmarks/longseq_profile.py)
        if packed:
            use_packed_attention(lm)
        head = lm.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            raise ValueError(f"{type(lm).__name__}: expected an output embedding (LM head) with a weight, found {head!r}")
        for attr in ("final_logit_softcapping", "logit_scale"):
            if getattr(lm.config, attr, None) not in (None, 1.0):
                raise ValueError(
                    f"{type(lm).__name__}: config.{attr}={getattr(lm.config, attr)} changes the logits after the LM "
                    "head; the chunked log-prob path supports plain heads (logits = h W^T + b) only"
                )

    @property
    def config(self) -> Any:
        return self.lm.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_ids: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi(response token) at the sampling temperature, [B, R] float32 (and entropy [B, R]).

        In the batch's layout ([left-padded prompt P | response R]) position P-1+t predicts response
        token t; the two ways of running the decoder below each return the final hidden states at those
        positions (past a row's last token they are other tokens' states, which the mask drops).
        """
        r = response_ids.shape[1]
        lengths = attention_mask.sum(dim=1).tolist()  # [B] real tokens per row: one host read
        # both ways give the same log-probs; packed rows are faster where padding adds enough, or
        # where long rows attend one at a time (cuDNN's kernel, plans shared by rows of nearby lengths)
        if self.packed and (packing_pays(lengths, self.pack_min_padding) or rows_attend_alone(lengths, input_ids.is_cuda)):
            hidden = self._packed_hidden(input_ids, attention_mask, r, lengths)  # [B, R, H]
        else:
            hidden = self._padded_hidden(input_ids, attention_mask, r, max(lengths, default=0))  # [B, R, H]
        head = self.lm.get_output_embeddings()
        return logprobs_from_hidden(
            hidden,
            head.weight,
            response_ids,
            temperature,
            bias=getattr(head, "bias", None),
            with_entropy=with_entropy,
        )

    def _padded_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, r: int, longest: int) -> torch.Tensor:
        """The rows left-justified (trainer.batch.left_justify: no attention mask, positions 0..S-1, which
        on every real token are ``trainer.batch.position_ids_from_mask``'s), where the position that
        predicts response token t is P-1+t minus the row's left padding."""
        ids, pads = left_justify(input_ids, attention_mask)  # ids [B, S], pads [B]
        # columns past the longest row are padding in every row: S may exceed it when the longest
        # prompt and the longest response belong to different rows
        ids = ids[:, : max(1, longest)]  # [B, L]
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # [B, L]
        hidden = self.lm.get_decoder()(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
        prompt_width = input_ids.shape[1] - r
        at = (prompt_width - 1 - pads).unsqueeze(1) + torch.arange(r, device=ids.device)  # [B, R]
        at = at.clamp(max=ids.shape[1] - 1)  # past a row's end: another token's state, masked out
        return hidden.gather(1, at.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # [B, R, H]

    def _packed_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, r: int, lengths: list[int]
    ) -> torch.Tensor:
        """The rows' real tokens end to end (trainer.batch.pack_rows), row i from packed index
        cu_seqlens[i]: the position that predicts response token t is that plus the row's prompt
        length - 1 + t."""
        rows = pack_rows(input_ids, attention_mask, lengths)
        packed = packed_call_kwargs(rows.cu_seqlens, rows.max_len, self.lm.config.layer_types, rows.bounds)
        hidden = self.lm.get_decoder()(
            input_ids=rows.ids, position_ids=rows.positions, use_cache=False, **packed
        ).last_hidden_state[0]  # [T, H]
        prompt_lengths = attention_mask[:, : input_ids.shape[1] - r].sum(dim=1)  # [B]
        first = rows.cu_seqlens[:-1].long() + prompt_lengths - 1  # [B]
        at = (first.unsqueeze(1) + torch.arange(r, device=hidden.device)).clamp(max=hidden.shape[0] - 1)  # [B, R]
        return hidden[at]  # [B, R, H]


# ----------------------------------------------------------------------------- FSDP2
def shard_model(
    policy: PolicyModel,
    device: torch.device,
    world_size: int,
    param_offload: bool = False,
    reshard_after_forward: bool = True,
) -> PolicyModel:
    """Apply FSDP2 in place: each decoder layer, then the wrapper as the root. Needs a process group.

    param_offload keeps the sharded parameters, gradients and optimizer step on the CPU
    (CPUOffloadPolicy); the forward and backward still run on ``device``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not dist.is_initialized():
        raise RuntimeError("FSDP2 needs an initialised process group (trainer.workers.distributed.DataParallel.init)")
    mesh = init_device_mesh(device.type, (world_size,))
    param_dtype = next(policy.parameters()).dtype
    compute = compute_dtype(param_dtype, device.type)
    mp = (
        MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        if compute != param_dtype
        else MixedPrecisionPolicy()
    )
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if param_offload else OffloadPolicy()
    kwargs = dict(mesh=mesh, mp_policy=mp, offload_policy=offload)
    for layer in decoder_layers(policy.lm):
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(policy, reshard_after_forward=reshard_after_forward, **kwargs)
    for module in policy.modules():
        if is_fsdp(module):
            _sum_gradients(module)
    return policy


def _sum_gradients(module: nn.Module) -> None:
    """Make the gradient reduce-scatter a plain sum (the loss weights are global already)."""
    module.set_gradient_divide_factor(1.0)
    # gloo has no PREMUL_SUM: ask for SUM with the divide factor applied (a no-op at 1) around it.
    force_sum = getattr(module, "set_force_sum_reduction_for_comms", None)
    if force_sum is not None:
        force_sum(True)


def is_fsdp(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The FSDP units of a model, unless its shards live on the CPU (CPUOffloadPolicy: left alone)."""
    mods = [m for m in model.modules() if is_fsdp(m)]
    params = list(model.parameters())
    if params and _is_dtensor(params[0]) and params[0].to_local().device.type == "cpu":
        return []
    return mods


@contextlib.contextmanager
def keep_gathered(model: nn.Module) -> Iterator[None]:
    """Keep FSDP's gathered parameters across the forward passes of several micro-batches
    (one all-gather per unit for the whole block instead of one per forward), then reshard.

    Plain modules and CPU-offloaded ones are left as they are."""
    mods = _fsdp_modules(model)
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in mods:
            m.set_reshard_after_forward(True, recurse=False)
            m.reshard()


def accumulate_gradients(model: nn.Module, last_micro_batch: bool) -> None:
    """Gradient accumulation under FSDP: reduce-scatter (and reshard) only after the mini-batch's last
    micro-batch; before it, gradients accumulate unsharded on each worker. A no-op for plain modules."""
    for m in _fsdp_modules(model):
        m.set_requires_gradient_sync(last_micro_batch, recurse=False)
        m.set_reshard_after_backward(last_micro_batch, recurse=False)


def _is_dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``t``: a DTensor's shard, or a plain tensor itself."""
    return t.to_local() if _is_dtensor(t) else t


def full_tensor(t: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """The whole tensor behind a (possibly sharded) parameter, on ``device`` (a collective for a
    DTensor over several ranks: every rank must call it in the same order). Shards offloaded to the
    CPU are moved to ``device`` first, since NCCL gathers device tensors only. Read it, do not write
    it: a plain tensor, or a one-rank DTensor's local shard, may come back as the parameter's own
    storage (every caller copies it)."""
    if not _is_dtensor(t):
        return t if device is None else t.to(device)
    from torch.distributed.tensor import DTensor

    local = t.to_local()
    if t.device_mesh.size() == 1 and local.shape == t.shape:  # one rank holds it all: no gather to run
        return local if device is None else local.to(device)  # else a collective per tensor, ~340 a reshard
    if device is not None and t.device != device:
        t = DTensor.from_local(local.to(device), t.device_mesh, t.placements, shape=t.shape, stride=t.stride())
    return t.full_tensor()


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """clip_grad_norm_ over plain tensors or DTensors (the total norm of a sharded model is gathered)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads and _is_dtensor(grads[0]):
        return _clip_sharded_grad_norm(grads, max_norm)
    total = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return float(total)


def _clip_sharded_grad_norm(grads: list[Any], max_norm: float) -> float:
    """The global L2 norm of FSDP2's gradient shards, and the clip, each rank on its own shards.

    Each rank sums the squares of its shards and one number is all-reduced. Why not clip_grad_norm_:
    with param_offload the shards are CPU tensors and its all-reduce would run on them, which NCCL
    cannot (only the sum, moved to the GPU, is reduced here)."""
    from torch.distributed.tensor import Shard

    mesh = grads[0].device_mesh
    if any(g.device_mesh != mesh or not all(isinstance(p, Shard) for p in g.placements) for g in grads):
        raise ValueError("clip_grad_norm: every gradient must be sharded (Shard placements) on one device mesh")
    local = [g.to_local() for g in grads]
    norms = [torch.linalg.vector_norm(t.detach(), dtype=torch.float32) for t in local]  # no fp32 copy of a shard
    squares = torch.stack(norms).pow(2).sum()  # [] on the shards' device
    if "nccl" in str(dist.get_backend(mesh.get_group())):
        squares = squares.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(squares, group=mesh.get_group())
    total = float(squares.sqrt())
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:  # as clip_grad_norm_: scale only when over the limit
        for t in local:
            t.mul_(coef)
    return total


# ----------------------------------------------------------------------------- state
def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """{name: whole tensor on the CPU}; a collective under FSDP (every rank calls it)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        out[name] = full_tensor(value, device if _is_dtensor(value) else None).detach().cpu().clone()
    return out


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy whole tensors into a model whose parameters may be sharded DTensors (each rank keeps its shard)."""
    from torch.distributed.tensor import distribute_tensor

    own = model.state_dict()
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    if missing or unexpected:
        raise ValueError(f"load_full_model_state: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    with torch.no_grad():
        for name, dst in own.items():
            src = state[name]
            if _is_dtensor(dst):
                local = dst.to_local()
                shard = distribute_tensor(src.to(dst.device_mesh.device_type), dst.device_mesh, dst.placements)
                local.copy_(shard.to_local())
            else:
                dst.copy_(src)


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's whole (unsharded) state keyed by parameter name; a collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move AdamW's moments (plain tensors or DTensors) to ``device``, and wait for the copies: a host
    copy read before its device-to-host copy lands would read garbage (a checkpoint, say)."""
    moved_cuda = False
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step" and value.device != device:
                moved_cuda = moved_cuda or value.device.type == "cuda" or device.type == "cuda"
                state[key] = value.to(device, non_blocking=True)
    if moved_cuda:
        torch.cuda.synchronize()


def reserve_pinned_moments(optimizer: torch.optim.Optimizer) -> int:
    """Grow the page-locked host pool by AdamW's two moments of every trained parameter (this worker's
    shard, its dtype) now, at set-up, after anything else that pins host memory; the bytes the pool
    grew by (torch rounds each block up to a power of two), or asked for where torch keeps no host
    statistics; 0 without CUDA.

    A copy of the moments to the host (``move_optimizer_state``, non-blocking) takes its destination
    from torch's caching host allocator, which pins new memory when it has no free block of the size:
    on one H200 host, 30.8 s of cudaHostAlloc for the 7B's moments in the first update_actor call, none
    in later calls (docs/benchmarks.md). Blocks of these sizes allocated and freed here stay in the
    pool, so that first copy finds them, and a step's timing holds no one-time cost of the process."""
    if not torch.cuda.is_available():
        return 0
    stats = getattr(torch.cuda, "host_memory_stats", None)
    before = stats().get("allocated_bytes.current", 0) if stats else 0
    blocks = [
        torch.empty(local.shape, dtype=local.dtype, pin_memory=True)
        for group in optimizer.param_groups
        for param in group["params"]
        if param.requires_grad  # AdamW keeps no state for a frozen parameter
        for local in [local_tensor(param)] * 2  # exp_avg, exp_avg_sq
    ]
    asked = sum(b.numel() * b.element_size() for b in blocks)  # what torch without host statistics reports
    grown = stats().get("allocated_bytes.current", 0) - before if stats else asked
    del blocks  # back to the pool, cached: the allocator returns pinned memory to CUDA only when asked
    return grown


@contextlib.contextmanager
def optimizer_state_on(optimizer: torch.optim.Optimizer, device: torch.device, offload: bool) -> Iterator[None]:
    """With ``offload`` (VERL's ``fsdp_config.optimizer_offload``), AdamW's moments live on the CPU
    between updates and on ``device`` for the body: one copy each way per update_actor call, which is
    where VERL's FSDP worker loads and offloads them (``load_fsdp_optimizer`` at the start of its
    ``update_actor``, ``offload_fsdp_optimizer`` at the end: verl/workers/fsdp_workers.py). Moments a
    first step creates are created on ``device`` and go to the CPU after it, as the others do."""
    if not offload:
        yield
        return
    try:
        move_optimizer_state(optimizer, device)
        yield
    finally:  # back on the host even if the update (or the copy in: out of memory) raised
        move_optimizer_state(optimizer, torch.device("cpu"))
