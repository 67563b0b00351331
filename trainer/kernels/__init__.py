"""Triton kernels and custom autograd functions; the pure math they speed up lives in trainer/algorithms."""
