"""FLOPs of a dense decoder (Qwen2/Llama), as VERL's flops counter computes them, and the values a decode
step reads (its memory-bandwidth bound).

With L layers, hidden H, intermediate I, n_h query heads of size d, n_kv key/value heads and vocab V:
    N = L * (3 H I + H (q + k + v + n_h d)) + 2 V H,  q = n_h d, k = v = n_kv d
    FLOPs(train step) = 6 N sum(s_i) + 6 sum(s_i^2) d n_h L
A forward pass alone is a third of that. Pure arithmetic on plain numbers: no torch import.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields

# Field metadata: every count is > 0 (a bound that validators of stored architectures can read).
_COUNT = {"gt": 0}


@dataclass(frozen=True)
class DecoderArch:
    """The numbers that fix a dense decoder's cost. The one definition of these fields: classes that
    describe a model in more detail (a run record's model) extend this one."""

    num_layers: int = field(metadata=_COUNT)
    hidden_size: int = field(metadata=_COUNT)
    intermediate_size: int = field(metadata=_COUNT)
    num_heads: int = field(metadata=_COUNT)
    num_kv_heads: int = field(metadata=_COUNT)
    head_dim: int = field(metadata=_COUNT)
    vocab_size: int = field(metadata=_COUNT)
    tie_word_embeddings: bool = False

    def to_dict(self) -> dict[str, int | bool]:
        """The cost-defining fields only, also on a subclass."""
        return {f.name: getattr(self, f.name) for f in fields(DecoderArch)}


def flops_params(arch: DecoderArch) -> int:
    """N in VERL's formula: matmul parameters per token (embedding counted as a projection)."""
    h, d = arch.hidden_size, arch.head_dim
    q = arch.num_heads * d
    k = v = arch.num_kv_heads * d
    o = arch.num_heads * d
    per_layer = 3 * h * arch.intermediate_size + h * (q + k + v + o)
    return arch.num_layers * per_layer + 2 * arch.vocab_size * h


def parameter_count(arch: DecoderArch) -> int:
    """Exact parameter count of a Qwen2 decoder (q/k/v biases, RMSNorm weights, tied or not)."""
    h, d = arch.hidden_size, arch.head_dim
    q = arch.num_heads * d
    kv = arch.num_kv_heads * d
    attn = h * q + q + 2 * (h * kv + kv) + q * h  # q, k, v carry biases in Qwen2; o does not
    mlp = 3 * h * arch.intermediate_size
    norms = 2 * h
    embeddings = arch.vocab_size * h * (1 if arch.tie_word_embeddings else 2)
    return arch.num_layers * (attn + mlp + norms) + embeddings + h  # + final norm


def train_flops(arch: DecoderArch, seqlens: Iterable[int]) -> float:
    """FLOPs of forward + backward over sequences of the given lengths."""
    lens = [int(s) for s in seqlens]
    dense = 6.0 * flops_params(arch) * sum(lens)
    attention = 6.0 * sum(s * s for s in lens) * arch.head_dim * arch.num_heads * arch.num_layers
    return dense + attention


def flops_per_token(arch: DecoderArch, context_length: int = 0, train: bool = True) -> float:
    """Average FLOPs per token of a sequence of ``context_length`` tokens (train: fwd + bwd)."""
    factor = 6.0 if train else 2.0
    return factor * flops_params(arch) + factor * context_length * arch.head_dim * arch.num_heads * arch.num_layers


# --- What a decode step reads (memory, not FLOPs): the bound of a bandwidth-bound generation. -------


def decode_weight_values(arch: DecoderArch) -> int:
    """Weight values one decode step reads: the layers' matrices and the LM head (the embedding is a
    row lookup, not a read of the whole table)."""
    return flops_params(arch) - arch.vocab_size * arch.hidden_size


def kv_values_per_position(arch: DecoderArch) -> int:
    """K and V values cached per token position, all layers together."""
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim


def kv_positions_read(prompt_lengths: Iterable[int], response_lengths: Iterable[int]) -> int:
    """Cached positions read while generating: a row of prompt p reads p + t positions at its step t
    (t = 0 .. r - 1), so r p + r (r - 1) / 2 over its r tokens."""
    return sum(r * p + r * (r - 1) // 2 for p, r in zip(prompt_lengths, response_lengths, strict=True))


def decode_values_read(arch: DecoderArch, prompt_lengths: Iterable[int], response_lengths: Iterable[int]) -> int:
    """Values one replica reads to generate these rows together: the weights once per decode step (as
    many steps as the longest row) and each row's cached K/V at each of its steps. Times the dtype's
    bytes, over the memory bandwidth: the decode's lower bound in seconds."""
    responses = list(response_lengths)
    return max(responses, default=0) * decode_weight_values(arch) + kv_values_per_position(arch) * kv_positions_read(
        prompt_lengths, responses
    )
