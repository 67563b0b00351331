"""The Triton decode matmuls that benchmarks time against cuBLAS, against the float64 product and
F.linear: the split-K kernel (benchmarks/split_matmul.py, timed by decode_kernels_tune.py) and the
chain kernel launched with and without PDL (benchmarks/pdl_matmul_chain.py).

The kernel tests run on a GPU with Triton, or on a CPU in Triton's interpreter (Triton 3.6 needs
numpy < 2.3 there), and are skipped otherwise:
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
