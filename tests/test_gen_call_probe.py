"""benchmarks/gen_call_probe.py and decode_profile.py's decode-group member (issue 31): the probe runs
end to end on CPU (its smoke mode), and a member model holds one GPU's share of a decode group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.models.presets import preset_config
from trainer.rollout.lean_decoder import lean_shape

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def test_a_member_model_holds_its_share_of_the_heads_and_the_mlp(monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from decode_profile import member_model

    member = member_model("tiny", 2, torch.device("cpu"))
    assert lean_shape(member.config) == lean_shape(preset_config("tiny")).sharded(2)
    with pytest.raises(ValueError, match="do not split evenly over 3"):
        member_model("tiny", 3, torch.device("cpu"))


def test_the_probe_warms_up_then_times_each_call_of_the_groups_rows(tmp_path):
    """--device cpu: the 7B replay's second decode group's 64 rows at 1/500 of their lengths, on the
    tiny preset as one member of 2; the warm-up is not traced, each timed call is."""
    command = [sys.executable, "gen_call_probe.py", str(tmp_path), "--model", "tiny", "--scale", "0.002",
               "--calls", "2", "--warm-up", "--device", "cpu"]
    subprocess.run(command, cwd=BENCHMARKS, check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "gen_call_probe.json").read_text())
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from gen_call_probe import group_rows
    finally:
        sys.path.remove(str(BENCHMARKS))
    lengths = [max(1, round(x * 0.002)) for x in group_rows("verl-7b", 4, 1, 2)]
    assert (result["rows"], result["tokens"], result["longest"]) == (64, sum(lengths), max(lengths))
    assert result["warm_up_s"] > 0 and [c["call"] for c in result["calls"]] == [0, 1]
    assert all(c["seconds"] > 0 for c in result["calls"])
    traced = [json.loads(line) for f in (tmp_path / "trace").iterdir() for line in f.read_text().splitlines()]
    assert [t["targets"] for t in traced] == [lengths, lengths]  # the two timed calls, not the warm-up
