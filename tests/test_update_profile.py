"""benchmarks/update_profile.py's trace reading: GPU busy time, the pauses, and whom they are filed
under, on a small chrome trace written here (the shape torch's profiler exports)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from update_profile import busy_and_gaps, fabricated_batch, kernel_family, read_trace  # noqa: E402


def test_overlapping_work_counts_once_and_short_pauses_are_not_pauses() -> None:
    # (start, end, correlation) in microseconds: two overlapping kernels, a 5 us turnaround, a 40 us pause
    busy, gaps = busy_and_gaps([(0.0, 10.0, 1), (5.0, 20.0, 2), (25.0, 30.0, 3), (70.0, 80.0, 4)])
    assert busy == pytest.approx(20.0 + 5.0 + 10.0)
    assert gaps == [(30.0, 40.0, 4)]  # the pause before the work of correlation 4


def _op(name: str, ts: float, dur: float, tid: int) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}


def _launch(name: str, ts: float, corr: int, tid: int, dur: float = 2.0, cat: str = "cuda_runtime") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {"correlation": corr}}


def _kernel(ts: float, dur: float, corr: int, cat: str = "kernel", name: str = "k") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def test_a_pause_is_filed_under_the_launching_threads_op_and_a_sync_under_its_caller(tmp_path: Path) -> None:
    events = [
        # thread 1 (the forward): a linear launches kernel 1; a .to copies from pageable memory and syncs
        _op("aten::linear", 0.0, 20.0, 1), _launch("cudaLaunchKernel", 5.0, 1, 1),
        _kernel(10.0, 100.0, 1),
        _op("aten::to", 30.0, 100.0, 1), _op("aten::copy_", 31.0, 98.0, 1),
        _launch("cudaMemcpyAsync", 32.0, 2, 1), _kernel(110.0, 4.0, 2, cat="gpu_memcpy", name="Memcpy HtoD (Pageable -> Device)"),
        _launch("cudaStreamSynchronize", 33.0, 0, 1, dur=85.0),
        # thread 2 (autograd) is inside its own op when thread 1's next launch comes late
        _op("autograd::engine::evaluate_function: MmBackward0", 100.0, 400.0, 2),
        _op("LigerRMSNormFunction", 300.0, 50.0, 1), _launch("cuLaunchKernelEx", 320.0, 3, 1, cat="cuda_driver"),
        _kernel(330.0, 20.0, 3),
    ]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    out = read_trace(path)
    assert out["gpu_busy_s"] == pytest.approx((100.0 + 4.0 + 20.0) / 1e6)
    assert out["gaps"] == 1 and out["gap_s"] == pytest.approx((330.0 - 114.0) / 1e6)
    # the late launch was thread 1's (a Triton kernel, launched through the driver), not thread 2's op
    assert out["gap_s_by_outermost_op"] == {"LigerRMSNormFunction": pytest.approx(216.0 / 1e6)}
    assert out["syncs"] == 1 and out["syncs_by_outermost_op"] == {"aten::to": 1}
    assert out["pageable_copies"] == 1
    # the host's calls by time in all: the sync's 85 us first
    assert list(out["runtime_s_by_call"])[0] == "cudaStreamSynchronize"
    assert out["runtime_s_by_call"]["cudaStreamSynchronize"] == pytest.approx(85.0 / 1e6)
    kernels = out["kernels_by_time"]
    assert kernels["family_s"] == {"other": pytest.approx(120.0 / 1e6), "copy": pytest.approx(4.0 / 1e6)}
    assert kernels["top_kernels"][0] == {"name": "k", "s": round((100.0 + 20.0) / 1e6, 4), "count": 2}


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("nvjet_sm90_tst_192x208_64x4_1x2_h_bz_coopB_TNT", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
        ("ncclDevKernel_AllGather_RING_LL", "nccl"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", "foreach"),
        ("Memcpy DtoH (Device -> Pinned)", "copy"),
        ("_rms_norm_backward_kernel", "other"),
    ],
)
def test_kernels_are_filed_by_family(name: str, family: str) -> None:
    assert kernel_family(name) == family


def test_fabricated_rows_must_make_whole_groups() -> None:
    import torch

    with pytest.raises(SystemExit, match="3 rows do not make whole groups of rollout.n=2"):
        fabricated_batch([4, 5, 6], prompt_length=2, n=2, vocab=10, gen=torch.Generator())


def test_fabricated_rows_have_the_asked_lengths_and_grpo_groups() -> None:
    import torch

    batch = fabricated_batch([5, 30, 12, 7], prompt_length=6, n=2, vocab=100, gen=torch.Generator().manual_seed(0))
    assert batch.response_mask.sum(dim=1).tolist() == [5, 30, 12, 7]
    assert batch.response_ids.shape == (4, 30) and batch.prompt_mask.sum().item() == 24
    assert batch.uids.tolist() == [0, 0, 1, 1]
    assert int(batch.response_ids[0, 5:].abs().sum()) == 0  # padding past a row's end
