"""Peak figures of GPU models, the denominators of MFU and bandwidth use, looked up by device name.

Names are matched upper-cased by substring, so the name torch reports ("NVIDIA H100 80GB HBM3") and
the short one a baseline states ("H100") find the same FLOP/s entry. A name that no entry matches has
no peak (None): the figure that needs it is then missing with that reason, never guessed.
"""

from __future__ import annotations

# Peak dense bf16 FLOP/s per device, as VERL's flops counter tables them (matched by substring, in
# order; VERL does not tell H100 SXM from PCIe, and neither do we, to stay comparable).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100", 989e12),
    ("H800", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("B200", 2.25e15),
    ("MI300X", 1336e12),
    ("L40S", 362e12),
)

# Peak memory bandwidth, bytes/s, from the vendors' data sheets. Every listed substring must occur;
# the first match wins, so the variants come before the generic names. A bare "H100" matches nothing:
# SXM (3.35 TB/s) and PCIe (2.0 TB/s) differ too much to pick one.
PEAK_MEMORY_BANDWIDTH: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H200",), 4.8e12),
    (("H100", "PCIE"), 2.0e12),
    (("H100", "NVL"), 3.9e12),
    (("H100", "SXM"), 3.35e12),
    (("H100", "HBM3"), 3.35e12),  # torch names the SXM part "NVIDIA H100 80GB HBM3"
    (("A100", "80GB", "PCIE"), 1.935e12),
    (("A100", "80GB"), 2.039e12),
    (("A100", "40GB"), 1.555e12),
)


def peak_bf16_flops(gpu_model: str) -> float | None:
    """Peak dense bf16 FLOP/s of one device of this model, or None when not tabled."""
    name = gpu_model.upper()
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def peak_memory_bandwidth(gpu_model: str) -> float | None:
    """Peak memory bandwidth, bytes/s, of one device of this model, or None when not tabled."""
    name = gpu_model.upper()
    return next((bw for keys, bw in PEAK_MEMORY_BANDWIDTH if all(k in name for k in keys)), None)
