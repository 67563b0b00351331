"""trainer.driver.checkpoint: atomic saves, verification, the latest-step tracker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.driver.checkpoint import (
    MANIFEST,
    TRACKER,
    CheckpointError,
    check_trainer_parts,
    complete_steps,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_dir,
    verify_checkpoint,
)
from trainer.driver.checkpoint_lock import LOCK_FILE, CheckpointLock, CheckpointLockError


def test_save_then_load_round_trip(tmp_path):
    parts = {"model": {"w": torch.arange(6.0)}, "trainer": {"global_step": 2, "loader": {"epoch": 0}}}
    path = save_checkpoint(tmp_path, 2, parts, meta={"note": "x"})
    assert path == step_dir(tmp_path, 2)
    loaded, manifest = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], torch.arange(6.0))
    assert loaded["trainer"] == {"global_step": 2, "loader": {"epoch": 0}}
    assert manifest["meta"] == {"note": "x"}
    assert latest_checkpoint(tmp_path) == path
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [LOCK_FILE]  # no temporaries left


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


# ----------------------------------------------------------------------------- loading refuses code
RAN: list[str] = []


def _record(note: str) -> None:
    RAN.append(note)


class RunsCodeWhenLoaded:
    """Unpickling this calls _record: what a hostile checkpoint part would do with os.system."""

    def __reduce__(self):
        return (_record, ("loaded",))


def test_a_part_holding_an_arbitrary_object_is_refused(tmp_path):
    RAN.clear()
    path = save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(2)}, "trainer": RunsCodeWhenLoaded()})
    with pytest.raises(CheckpointError, match=r"trainer.pt: .*weights_only"):
        load_checkpoint(path)
    assert RAN == []  # refused before the pickled call ran


def test_model_optimizer_and_trainer_parts_round_trip_under_weights_only(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    trainer = {
        "global_step": 7,
        "loader": {"seed": 1, "epoch": 2, "position": 0, "batch_size": 4, "num_prompts": 9, "shuffle": True},
        "kl_coef": 0.001,
    }
    parts = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "trainer": trainer}
    loaded, _ = load_checkpoint(save_checkpoint(tmp_path, 7, parts))
    assert loaded["trainer"] == trainer
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.state_dict().items())
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)
    restored = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters())
    restored.load_state_dict(loaded["optimizer"])
    assert torch.equal(restored.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


# ----------------------------------------------------------------------------- the manifest's files
def _rewrite_manifest(path, **changes):
    manifest = json.loads((path / MANIFEST).read_text())
    for key, value in changes.items():
        if value is None:
            del manifest[key]
        else:
            manifest[key] = value
    (path / MANIFEST).write_text(json.dumps(manifest))


def test_a_checkpoint_missing_what_a_trainer_resumes_from_names_it(tmp_path):
    # Before: a format-2 manifest without its shards section (or any without trainer.pt) passed
    # verification and the resume ended in a bare KeyError naming no file.
    whole = {"model": {"w": torch.ones(2)}, "optimizer": {"state": {}}, "trainer": {"global_step": 1}}
    path = save_checkpoint(tmp_path, 1, whole)
    parts, manifest = load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r'format_version 2 needs a "shards" section') as info:
        check_trainer_parts(manifest, parts, path / MANIFEST)
    assert str(path / MANIFEST) in str(info.value) and "model.pt" in str(info.value)
    check_trainer_parts({**manifest, "format_version": 1}, parts, path / MANIFEST)  # the whole format: complete
    without_trainer = {k: v for k, v in parts.items() if k != "trainer"}
    with pytest.raises(CheckpointError, match=r"format_version 1 needs trainer\.pt"):
        check_trainer_parts({**manifest, "format_version": 1}, without_trainer, path / MANIFEST)
    with pytest.raises(CheckpointError, match=r"needs optimizer\.pt"):
        check_trainer_parts({**manifest, "format_version": 1}, {"trainer": {}, "model": {}}, path / MANIFEST)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (None, r"manifest.json: field 'files': expected a mapping of file name to size and SHA-256, found none"),
        ({}, r"manifest.json: field 'files': expected at least one file, found none"),
        ([], r"manifest.json: field 'files': expected a mapping .*found list"),
    ],
)
def test_a_manifest_without_files_is_refused(tmp_path, files, message):
    path = save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(2)}})
    _rewrite_manifest(path, files=files)
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


@pytest.mark.parametrize("name", ["../model.pt", "sub/model.pt", "..", "/etc/passwd", "a\\b.pt", ""])
def test_a_manifest_file_name_outside_the_directory_is_refused(tmp_path, name):
    path = save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(2)}})
    info = json.loads((path / MANIFEST).read_text())["files"]["model.pt"]
    _rewrite_manifest(path, files={name: info})
    with pytest.raises(CheckpointError, match=r"manifest.json: field 'files': expected plain file names"):
        verify_checkpoint(path)


# ----------------------------------------------------------------------------- one writer per directory
HOLD_LOCK = """
import sys, time
from trainer.driver.checkpoint_lock import CheckpointLock
CheckpointLock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def other_run(tmp_path):
    """A second process holding the checkpoint lock of tmp_path/ckpt (killed, by pid, afterwards)."""
    root = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(root)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield root, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_directory_in_use_by_another_run_is_refused_naming_it_and_the_holder(other_run):
    root, proc = other_run
    with pytest.raises(CheckpointLockError) as err:
        CheckpointLock.acquire(root)
    assert str(root.resolve()) in str(err.value) and f"pid {proc.pid}" in str(err.value)
    # a save of the same step from here (before: "Directory not empty", or interleaved steps) is refused
    with pytest.raises(CheckpointLockError, match=f"pid {proc.pid}"):
        save_checkpoint(root, 1, {"model": {"w": torch.zeros(2)}})
    assert not step_dir(root, 1).exists()
    proc.kill()
    proc.wait(timeout=30)
    lock = CheckpointLock.acquire(root)  # the kernel dropped the dead holder's lock
    try:
        assert (root / LOCK_FILE).read_text().strip() == str(os.getpid())
        save_checkpoint(root, 1, {"model": {"w": torch.zeros(2)}})  # under the lock this process holds
    finally:
        lock.release()


def test_python_m_trainer_in_a_directory_in_use_ends_with_one_error_line(other_run, tmp_path):
    # before: a traceback ending in CheckpointLockError
    root, proc = other_run
    small = ["data.synthetic_difficulty=tiny", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--workdir", str(tmp_path / "work"), "trainer.save_freq=1",
         f"trainer.default_local_dir={root}", *small],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the checkpoint directory ") and f"pid {proc.pid}" in last, last


def test_temporaries_of_dead_writers_are_removed_when_the_lock_is_taken(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait(timeout=30)
    dead, alive = finished.pid, os.getppid()
    stale = [f".global_step_3.tmp-{dead}-ab12", ".global_step_4.tmp-x9y8z7", f".global_step_2.old-{dead}"]
    kept = [f".global_step_5.tmp-{alive}-cd34", "global_step_1"]
    for name in stale + kept:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.pt").write_bytes(b"partial")
    (tmp_path / f".latest_checkpointed_iteration.txt.tmp-{dead}").write_text("3")
    lock = CheckpointLock.acquire(tmp_path)
    try:
        left = sorted(p.name for p in tmp_path.iterdir())
    finally:
        lock.release()
    assert left == sorted([*kept, LOCK_FILE])


# ----------------------------------------------------------------------------- trainer.max_actor_ckpt_to_keep
def _save(root, step, keep=None):
    return save_checkpoint(root, step, {"model": {"w": torch.full((2,), float(step))}}, keep=keep)


def test_keep_bounds_the_complete_checkpoints_to_the_newest(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    (tmp_path / "global_step_0").mkdir()  # no manifest: not a checkpoint, left alone
    _save(tmp_path, 4, keep=2)
    assert complete_steps(tmp_path) == [3, 4]
    assert (tmp_path / "global_step_0").is_dir()
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 4)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [LOCK_FILE]  # no temporaries left
    _save(tmp_path, 5, keep=1)  # the step just written is always kept
    assert complete_steps(tmp_path) == [5]


def test_keep_none_keeps_every_checkpoint_and_newer_steps_are_never_removed(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    assert complete_steps(tmp_path) == [1, 2, 3]
    _save(tmp_path, 2, keep=1)  # re-saving an older step (a resumed run): step 3 is newer, kept
    assert complete_steps(tmp_path) == [2, 3]


def test_keep_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 1, got 0"):
        _save(tmp_path, 1, keep=0)


def test_nothing_is_removed_while_another_run_holds_the_lock(other_run):
    root, proc = other_run
    root.mkdir(exist_ok=True)
    for step in (1, 2):  # written as if by the holder: complete step directories
        src = _save(root.parent / "elsewhere", step)
        src.rename(step_dir(root, step))
    with pytest.raises(CheckpointLockError, match=f"pid {proc.pid}"):
        _save(root, 3, keep=1)
    assert complete_steps(root) == [1, 2]
