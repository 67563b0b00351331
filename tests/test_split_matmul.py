"""The Triton decode matmuls that benchmarks time against cuBLAS, against the float64 product and
F.linear: the split-K kernel (benchmarks/split_matmul.py, timed by decode_kernels_tune.py), the
chain kernel launched with and without PDL (benchmarks/pdl_matmul_chain.py), and the fused decode MLP
kernels (benchmarks/decode_mlp.py, timed by decode_mlp_probe.py) against the float64 MLP rounded where
the engine rounds.

The kernel tests run on a GPU with Triton, or on a CPU in Triton's interpreter (Triton 3.6 needs
numpy < 2.3 there), and are skipped otherwise (the MLP's barrier kernel only on a GPU: the interpreter
runs one program at a time, so a barrier across programs would wait forever):
    TRITON_INTERPRET=1 python -m pytest tests/test_split_matmul.py -p no:cacheprovider
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not HAS_TRITON or (DEVICE == "cpu" and not INTERPRETED), reason="needs Triton on a GPU, or TRITON_INTERPRET=1"
)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The float64 product, rounded once to x's dtype: what any float32-accumulating kernel is near."""
    out = x.double() @ weight.double().T
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)


def one_step(dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` at 1: results are compared relative to the output's scale."""
    return torch.finfo(dtype).eps


def transposed(n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """A weight [N, K] stored [K, N], as the engine keeps its matrices on CUDA (LeanWeights)."""
    return torch.randn(k, n, dtype=dtype, device=DEVICE).T


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows,n,k,split,bias,layout",
    [
        (5, 96, 160, 1, False, "plain"),  # one share: the kernel's own epilogue
        (5, 96, 160, 3, True, "plain"),  # 160 over 3 shares of 64: the last share is short
        (16, 200, 96, 2, True, "transposed"),  # N not a multiple of the tile
        (33, 64, 256, 4, False, "transposed"),  # rows over two m tiles
        (7, 48, 100, 8, True, "plain"),  # K not a multiple of the tile; fewer shares hold any K than asked
    ],
)
def test_split_matmul_matches_the_product(dtype, rows, n, k, split, bias, layout):
    from split_matmul import SplitPlan, split_matmul

    torch.manual_seed(rows * 1000 + n + k + split)
    x = torch.randn(rows, k, dtype=dtype, device=DEVICE)
    w = transposed(n, k, dtype) if layout == "transposed" else torch.randn(n, k, dtype=dtype, device=DEVICE)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    plan = SplitPlan(block_m=32, block_n=32, block_k=32, split=split)
    assert_near_the_product(split_matmul(x, w, b, plan), x, w, b)


def assert_near_the_product(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    want = reference(x, w, b)
    assert out.shape == want.shape and out.dtype == x.dtype
    # one rounding to dtype (two in the interpreter, which truncates to bf16 instead of rounding),
    # after float32 sums whose error grows with the terms' magnitudes, in another order than F.linear's
    magnitude = (x.double().abs() @ w.double().abs().T).max().item()
    allowed = 2 * one_step(x.dtype) * want.float().abs().max().item() + 16 * one_step(torch.float32) * magnitude
    worst = (out.float() - want.float()).abs().max().item()
    assert worst <= allowed, f"largest difference from the float64 product {worst:.3g} > allowed {allowed:.3g}"
    assert (out.float() - F.linear(x, w, b).float()).abs().max().item() <= allowed


@needs_triton
def test_split_matmul_is_the_same_every_run_and_for_every_split_of_equal_shares():
    """No atomics: the shares are summed in a fixed order, so a result repeats bit for bit."""
    from split_matmul import SplitPlan, split_matmul

    torch.manual_seed(0)
    x = torch.randn(8, 256, device=DEVICE)
    w = torch.randn(64, 256, device=DEVICE)
    plan = SplitPlan(block_m=16, block_n=32, block_k=32, split=4)
    first = split_matmul(x, w, None, plan)
    assert torch.equal(first, split_matmul(x, w, None, plan))


@needs_triton
def test_split_matmul_names_bad_shapes():
    from split_matmul import SplitPlan, split_matmul

    plan = SplitPlan(block_m=16, block_n=32, block_k=32, split=2)
    with pytest.raises(ValueError, match=r"x \[rows, K\] and weight \[N, K\]"):
        split_matmul(torch.zeros(4, 8, device=DEVICE), torch.zeros(16, 9, device=DEVICE), None, plan)
    with pytest.raises(ValueError, match="bias"):
        split_matmul(torch.zeros(4, 8, device=DEVICE), torch.zeros(16, 8, device=DEVICE), torch.zeros(3, device=DEVICE), plan)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows,n,k,tile,bias",
    [
        (4, 96, 160, (16, 32, 4, 4), True),  # K over five tiles, the first loaded before the loop
        (3, 40, 70, (32, 128, 4, 4), False),  # K within the first tile: no loop; N not a multiple of the tile
        (17, 64, 200, (16, 64, 4, 4), True),  # rows past 16: a 32-row tile
    ],
)
def test_chain_matmul_matches_the_product(dtype, rows, n, k, tile, bias):
    from pdl_matmul_chain import chain_matmul

    torch.manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k + 8, dtype=dtype, device=DEVICE)[:, :k]  # a view, as the chain's q part is
    w = torch.randn(n, k, dtype=dtype, device=DEVICE)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    out = chain_matmul(x, w, b, tile, interpreted=INTERPRETED)
    assert_near_the_product(out, x, w, b)


@needs_triton
def test_chain_matmul_names_what_it_cannot_take():
    from pdl_matmul_chain import chain_matmul

    x, w = torch.zeros(4, 8, device=DEVICE), torch.zeros(16, 8, device=DEVICE)
    with pytest.raises(ValueError, match="trigger 'soon'; valid: early, late, exit"):
        chain_matmul(x, w, None, (16, 32, 4, 4), trigger="soon")
    with pytest.raises(ValueError, match="rows <= 128 and unit strides along K"):
        chain_matmul(torch.zeros(129, 8, device=DEVICE), w, None, (16, 32, 4, 4))
    with pytest.raises(ValueError, match="unit strides along K"):
        chain_matmul(torch.zeros(8, 4, device=DEVICE).T, w, None, (16, 32, 4, 4))


# The interpreter converts float32 to bfloat16 by truncation (triton/runtime/interpreter.py), so there
# the MLP kernels run in float32; bfloat16's roundings are checked on a GPU
MLP_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


def mlp_weights(rows: int, hidden: int, inter: int, seed: int = 0):
    """x [rows, hidden]; gate/up [2 I, hidden] and down [hidden, I], stored transposed as the engine stores them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen).to(MLP_DTYPE).to(DEVICE)
    gate_up = (torch.randn(hidden, 2 * inter, generator=gen) * hidden**-0.5).to(MLP_DTYPE).to(DEVICE).T
    down = (torch.randn(inter, hidden, generator=gen) * inter**-0.5).to(MLP_DTYPE).to(DEVICE).T
    return x, gate_up, down


def assert_near_the_rounded(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Within two of the dtype's steps at the output's scale (float32 sums in another order, then one
    rounding; a rounded intermediate may flip too) and, in bfloat16, most values equal."""
    scale = want.float().abs().max().item()
    worst = (got.float() - want.float()).abs().max().item() / scale
    steps = 2 if want.dtype == torch.bfloat16 else 64  # float32: the sums' order moves the last bits
    assert worst <= steps * one_step(want.dtype), f"{what}: max |diff| / scale {worst:.3g}"
    if want.dtype == torch.bfloat16:
        same = (got == want).float().mean().item()
        assert same >= 0.9, f"{what}: only {same:.3f} of the values equal the reference's"


@needs_triton
@pytest.mark.parametrize("rows,hidden,inter,block_c,block_k", [
    (5, 80, 80, 32, 32),  # I not a multiple of the chunk, hidden not of the K tile
    (16, 64, 64, 64, 64),  # one chunk, one K tile
    (20, 112, 160, 32, 64),  # rows over one m tile of 16; hidden not of the K tile
])
def test_gate_up_silu_and_down_tiles_match_the_rounded_float64_mlp(rows, hidden, inter, block_c, block_k):
    import decode_mlp

    x, gate_up, down = mlp_weights(rows, hidden, inter)
    inter_out = decode_mlp.gate_up_silu(x, gate_up, block_c, block_k, interpreted=INTERPRETED)
    want_inter = decode_mlp.reference_intermediate(x, gate_up)
    assert_near_the_rounded(inter_out, want_inter, "gate_up_silu")
    # output tiles of 32 and K tiles of 32: the last output tile part-filled where hidden is 80 or 112,
    # the last K tile where I is 80
    out = decode_mlp.down_tiles(want_inter, down, 32, 32, interpreted=INTERPRETED)
    assert_near_the_rounded(out, (want_inter.double() @ down.double().T).to(MLP_DTYPE), "down_tiles")
    assert_near_the_rounded(decode_mlp.down_tiles(inter_out, down, 32, 32, interpreted=INTERPRETED),
                            decode_mlp.reference_mlp(x, gate_up, down), "both")


@needs_triton
def test_mlp_atomic_matches_and_leaves_its_buffer_zero():
    import decode_mlp

    rows, hidden, inter = 6, 96, 112
    x, gate_up, down = mlp_weights(rows, hidden, inter, seed=1)
    acc = torch.zeros(rows * hidden, dtype=torch.float32, device=DEVICE)
    out = decode_mlp.mlp_atomic(x, gate_up, down, acc, block_c=32, block_k=32, block_n=64, interpreted=INTERPRETED)
    assert_near_the_rounded(out, decode_mlp.reference_mlp(x, gate_up, down), "mlp_atomic")
    assert int(torch.count_nonzero(acc)) == 0, "the float32 buffer must be zero again for the next call"


@needs_triton
def test_mlp_kernels_name_inputs_they_cannot_read():
    import decode_mlp

    x, gate_up, down = mlp_weights(4, 64, 64)
    with pytest.raises(ValueError, match="x must be .rows, features. with unit stride"):
        decode_mlp.gate_up_silu(x.T.contiguous().T, gate_up, interpreted=INTERPRETED)
    with pytest.raises(ValueError, match="at most 128 rows"):
        decode_mlp.gate_up_silu(torch.zeros(129, 64, dtype=x.dtype, device=DEVICE), gate_up, interpreted=INTERPRETED)


@pytest.mark.skipif(DEVICE != "cuda" or not HAS_TRITON, reason="the barrier kernel needs every program resident: a GPU")
def test_mlp_barrier_matches_repeats_and_resets_its_counters():
    import decode_mlp

    rows, hidden, inter = 5, 1000, 4000  # fewer rows than the m tile; neither width a multiple of a tile
    x, gate_up, down = mlp_weights(rows, hidden, inter, seed=2)
    scratch = torch.empty(rows, inter, dtype=MLP_DTYPE, device=DEVICE)
    sync = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    want = decode_mlp.reference_mlp(x, gate_up, down)
    first = None
    for _ in range(20):
        scratch.fill_(float("nan"))  # a read of the intermediate before its writes would show as NaN
        got = decode_mlp.mlp_barrier(x, gate_up, down, scratch, sync, programs)
        assert not got.isnan().any(), "the barrier let a program read the intermediate before it was written"
        if first is None:
            first = got
            assert_near_the_rounded(first, want, "mlp_barrier")
        assert torch.equal(got, first)
    assert sync.tolist() == [0, 0]
    with pytest.raises(ValueError, match="programs; between 1 and the GPU's"):
        decode_mlp.mlp_barrier(x, gate_up, down, scratch, sync, programs + 1)
