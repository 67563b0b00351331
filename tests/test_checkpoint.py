"""trainer.driver.checkpoint: atomic saves, verification, the latest-step tracker."""

from __future__ import annotations

import os

import pytest
import torch

from trainer.driver.checkpoint import (
    TRACKER,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_dir,
    verify_checkpoint,
)


def test_save_then_load_round_trip(tmp_path):
    parts = {"model": {"w": torch.arange(6.0)}, "trainer": {"global_step": 2, "loader": {"epoch": 0}}}
    path = save_checkpoint(tmp_path, 2, parts, meta={"note": "x"})
    assert path == step_dir(tmp_path, 2)
    loaded, manifest = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], torch.arange(6.0))
    assert loaded["trainer"] == {"global_step": 2, "loader": {"epoch": 0}}
    assert manifest["meta"] == {"note": "x"}
    assert latest_checkpoint(tmp_path) == path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_a_crash_mid_save_leaves_no_valid_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(2)}})

    class Boom:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"model": {"w": torch.ones(2)}, "trainer": Boom()})
    assert not step_dir(tmp_path, 2).exists()
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 1)  # the tracker still names step 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".global_step_2")]


def test_corruption_is_detected_and_named(tmp_path):
    path = save_checkpoint(tmp_path, 3, {"model": {"w": torch.zeros(100)}})
    with (path / "model.pt").open("r+b") as fh:
        fh.seek(-5, os.SEEK_END)
        fh.write(b"xxxxx")
    with pytest.raises(CheckpointError, match=r"model.pt: size or SHA-256 differs"):
        verify_checkpoint(path)


def test_incomplete_directory_is_not_a_checkpoint(tmp_path):
    (tmp_path / "global_step_5").mkdir()
    (tmp_path / TRACKER).write_text("5")
    with pytest.raises(CheckpointError, match="incomplete"):
        latest_checkpoint(tmp_path)


def test_no_tracker_means_no_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path) is None
