"""Triton kernels and custom autograd functions; the pure math they speed up lives in trainer/algorithms."""

from __future__ import annotations

import functools

import torch


@functools.cache
def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors a kernel's grid is sized against: the GPU's, or 4 off a GPU
    (Triton's interpreter, where the count only shapes the grid)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
