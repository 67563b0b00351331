"""benchmarks/checkpoint_profile.py on CPU: it saves one rank's state the save's way and reports each stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_profile_saves_every_byte_of_a_rank_and_times_each_stage(tmp_path: Path) -> None:
    out, scratch = tmp_path / "profile.json", tmp_path / "scratch"
    script = ROOT / "benchmarks" / "checkpoint_profile.py"
    cmd = [sys.executable, str(script), str(out), "--preset", "tiny", "--ranks", "2", "--dir", str(scratch)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert [s["one_copy_at_a_time"] for s in result["save"]] == [False, True, False, True]
    for save in result["save"]:
        # torch.save adds its archive's headers to the tensors' bytes
        assert sum(p["bytes"] for p in save["parts"]) > result["bytes"] > 0
        assert all(p["total_s"] >= p["copy_s"] + p["save_hash_write_s"] for p in save["parts"])
    assert set(result["disk_write_gbps"]) == {"1", "4"} and min(result["disk_write_gbps"].values()) > 0
    assert not scratch.exists()  # the scratch directory is removed
