"""Sharded checkpoints: each worker writes its own shard of model and optimizer state, nothing gathered.

Over Ray (two one-CPU nodes, gloo, the tiny preset): two FSDP2 workers save, and a resumed run's
next step equals the uninterrupted run's; a corrupted shard is refused naming the file, before any
worker loads a byte; the same checkpoint loads on one worker (resharded) and on two dp workers (a
replica each, which save one file between them); and a checkpoint of the old whole-state format (1)
still loads. Without Ray: the manifest's shards section is validated field by field, and a tensor
is assembled from the rows of several files.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from adam_steps import assert_same_adam_steps, moments_from_state_dict

from trainer.build import build_trainer
from trainer.checkpoint_files import CheckpointError, write_torch_file
from trainer.config import build_config
from trainer.driver.checkpoint import MANIFEST, TRACKER, save_checkpoint, step_dir, verify_checkpoint
from trainer.driver.checkpoint_shards import shard_files
from trainer.phases import CHECKPOINT_BYTES
from trainer.workers.shard_state import FILES_PER_RANK, ShardSources, balanced_parts

COMMON = [
    "data.synthetic_difficulty=tiny",
    "data.train_batch_size=8",
    "data.max_response_length=6",
    "actor_rollout_ref.rollout.name=static",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "trainer.n_gpus_per_node=1",
]


def make_trainer(tmp_path, workers: int, *extra: str):
    cfg = build_config(COMMON + [f"trainer.nnodes={workers}", f"trainer.default_local_dir={tmp_path / 'ckpt'}", *extra])
    return build_trainer(cfg, tmp_path)


def gathered(trainer) -> dict:
    """The whole model and optimizer state (the workers' ``state``: a gather, for comparing only)."""
    return trainer.workers.all("state")[0]


def assert_same_state(got: dict, expected: dict, exact: bool = True) -> None:
    """The same weights and AdamW moments, bit for bit; or (``exact`` False: the same steps taken
    another way) the same first moments and the same weights but for the step difference those
    explain (tests/adam_steps.py: where a gradient is ~0 its rounding noise decides Adam's step)."""
    assert got["model"].keys() == expected["model"].keys()
    if not exact:
        # FSDP2's optimizer state is keyed by parameter name: no model is needed to name indices
        got_moments, expected_moments = (moments_from_state_dict(s["optimizer"], torch.nn.Module()) for s in (got, expected))
        assert_same_adam_steps(got["model"], expected["model"], got_moments, expected_moments, lr=1e-2, moment_rtol=1e-4)
        return
    for name, value in expected["model"].items():
        assert torch.equal(got["model"][name], value), name
    for name, moments in expected["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(got["optimizer"]["state"][name][key], value), f"{name}/{key}"


@pytest.fixture(scope="module")
def straight_run(two_node_cluster, tmp_path_factory):
    """Three steps on two FSDP2 workers, saving every second step: (root, state at 2, step 3's loss, state at 3,
    the three steps' metrics)."""
    tmp_path = tmp_path_factory.mktemp("straight")
    trainer = make_trainer(tmp_path, 2, "trainer.save_freq=2")
    try:
        metrics = [trainer.train_step(next(trainer.loader)).metrics]
        metrics.append(trainer.train_step(next(trainer.loader)).metrics)  # saves step 2
        at_2 = gathered(trainer)
        metrics.append(trainer.train_step(next(trainer.loader)).metrics)
        at_3 = gathered(trainer)
    finally:
        trainer.shutdown()
    return tmp_path / "ckpt", at_2, metrics[2]["actor/pg_loss"], at_3, metrics


def test_a_step_that_saves_reports_the_bytes_its_checkpoint_holds(straight_run):
    """save_checkpoint's work (its GB/s per GPU divides it): every file of the step's checkpoint, as on
    disk, and at least the weights and AdamW moments it holds; a step that does not save reports none."""
    root, at_2, _, _, metrics = straight_run
    on_disk = sum(p.stat().st_size for p in step_dir(root, 2).iterdir() if p.name != MANIFEST)
    assert metrics[1][CHECKPOINT_BYTES] == on_disk
    tensors = [*at_2["model"].values(), *(v for m in at_2["optimizer"]["state"].values() for v in m.values())]
    held = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    assert held <= on_disk, (held, on_disk)
    assert CHECKPOINT_BYTES not in metrics[0] and CHECKPOINT_BYTES not in metrics[2]


def test_each_worker_writes_its_shard_and_a_resumed_run_takes_the_same_step(straight_run, tmp_path):
    root, at_2, loss_3, at_3, _ = straight_run
    path = step_dir(root, 2)
    shards = [f"shard_world_size_2_rank_{rank}_part_{part}.pt" for rank in (0, 1) for part in range(FILES_PER_RANK)]
    assert sorted(p.name for p in path.iterdir()) == sorted([MANIFEST, "trainer.pt", *shards])
    manifest = verify_checkpoint(path)  # every file hashed as written, and as read now
    assert manifest["format_version"] == 2 and manifest["shards"]["world_size"] == 2
    resumed = make_trainer(tmp_path, 2, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={path}")
    try:
        assert resumed.resume() == 2
        assert_same_state(gathered(resumed), at_2)
        loss = resumed.train_step(next(resumed.loader)).metrics["actor/pg_loss"]
        assert loss == loss_3
        assert_same_state(gathered(resumed), at_3)
    finally:
        resumed.shutdown()


def test_a_corrupted_shard_is_refused_naming_it_before_anything_loads(straight_run, tmp_path):
    root, at_2, _, _, _ = straight_run
    copy = shutil.copytree(step_dir(root, 2), tmp_path / "copy" / "global_step_2")
    shard = copy / "shard_world_size_2_rank_1_part_2.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    shard.write_bytes(bytes(data))
    trainer = make_trainer(tmp_path, 2)
    try:
        before = gathered(trainer)
        with pytest.raises(CheckpointError, match=r"shard_world_size_2_rank_1_part_2.pt: size or SHA-256 differs"):
            trainer.load_checkpoint(copy)
        assert_same_state(gathered(trainer), before)  # no worker loaded anything
        assert trainer.global_step == 0
    finally:
        trainer.shutdown()


def test_two_workers_checkpoint_loads_on_one_and_the_old_whole_format_still_loads(straight_run, tmp_path):
    root, at_2, loss_3, at_3, _ = straight_run
    old = tmp_path / "old"  # format 1: the whole state as parts, as the driver used to write it
    trainer_part = torch.load(step_dir(root, 2) / "trainer.pt", weights_only=True)
    save_checkpoint(old, 2, {"model": at_2["model"], "optimizer": at_2["optimizer"], "trainer": trainer_part})
    manifest = json.loads((step_dir(old, 2) / MANIFEST).read_text())
    (step_dir(old, 2) / MANIFEST).write_text(json.dumps({**manifest, "format_version": 1}))
    one = make_trainer(tmp_path, 1)
    try:
        assert one.load_checkpoint(step_dir(old, 2)) == 2
        assert_same_state(gathered(one), at_2)
        one.workers.all("load_state", {"model": {k: v * 0 for k, v in at_2["model"].items()},
                                       "optimizer": at_2["optimizer"]})
        assert one.load_checkpoint(step_dir(root, 2)) == 2  # resharded: 2 files into 1 worker
        assert_same_state(gathered(one), at_2)
        loss = one.train_step(next(one.loader)).metrics["actor/pg_loss"]
        assert loss == pytest.approx(loss_3, rel=1e-4, abs=1e-6)
        assert_same_state(gathered(one), at_3, exact=False)  # summed over 1 worker, not 2
    finally:
        one.shutdown()


# ----------------------------------------------------------------------------- without Ray
def _spans(rows: range, whole: int = 5) -> dict:
    return {"w": {"shape": [whole, 2], "dtype": "torch.float32", "offset": rows.start, "rows": len(rows)}}


def test_a_tensor_is_assembled_from_the_rows_of_several_files(tmp_path):
    whole = torch.arange(10.0).reshape(5, 2)
    for name, rows in (("a.pt", range(0, 3)), ("b.pt", range(3, 5))):
        write_torch_file(tmp_path / name, {"tensors": {"w": whole[rows.start : rows.stop].clone()}})
    target = torch.zeros(5, 2)
    sources = ShardSources([(tmp_path / "a.pt", _spans(range(0, 3))), (tmp_path / "b.pt", _spans(range(3, 5)))])
    sources.fill("w", target)
    assert torch.equal(target, whole) and sources.unused() == []
    with pytest.raises(CheckpointError, match=r"w: rows 0..5 are in no shard file"):
        ShardSources([(tmp_path / "a.pt", _spans(range(0, 3)))]).fill("w", torch.zeros(5, 2))
    with pytest.raises(CheckpointError, match=r"a.pt: w was saved as torch.float32 \[5, 2\], this model holds"):
        ShardSources([(tmp_path / "a.pt", _spans(range(0, 3)))]).fill("w", torch.zeros(5, 3))


def test_a_workers_tensors_are_split_into_files_of_about_equal_size():
    sizes = {"a": 10, "b": 1, "c": 6, "d": 5, "e": 1}
    assert balanced_parts(sizes, 3) == [["a"], ["c", "e"], ["b", "d"]]
    assert balanced_parts({"a": 4}, 3) == [["a"]]  # no empty files


def _sharded_manifest(tmp_path) -> dict:
    (tmp_path / "s.pt").write_bytes(b"x")
    files = {"s.pt": {"bytes": 1, "sha256": "0" * 64}}
    return {"files": files, "shards": {"strategy": "fsdp2", "world_size": 2,
                                       "files": {"s.pt": {"rank": 1, "tensors": _spans(range(3, 5))}}}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(shards=[]), r"field 'shards': expected a mapping of strategy, world_size and files"),
        (lambda m: m["shards"].update(world_size=0), r"expected world_size to be a number of workers, found 0"),
        (lambda m: m["shards"].update(files={}), r"expected 'files' to map at least one file"),
        (lambda m: m["shards"]["files"].update({"t.pt": {"rank": 0, "tensors": {}}}), r"'t.pt' is not listed under 'files'"),
        (lambda m: m["shards"]["files"]["s.pt"].update(rank=2), r"'s.pt''s rank in 0..1, found 2"),
        (lambda m: m["shards"]["files"]["s.pt"]["tensors"]["w"].update(rows=3), r"'s.pt' tensor 'w': expected offset"),
        (lambda m: m["shards"]["files"]["s.pt"]["tensors"]["w"].pop("dtype"), r"'s.pt' tensor 'w': expected a mapping"),
    ],
)
def test_a_malformed_shards_section_is_refused_naming_the_field(tmp_path, change, message):
    manifest = _sharded_manifest(tmp_path)
    assert list(shard_files(manifest, tmp_path / MANIFEST)) == ["s.pt"]
    change(manifest)
    with pytest.raises(CheckpointError, match=message):
        shard_files(manifest, tmp_path / MANIFEST)


def test_an_unknown_format_version_is_refused_naming_the_readable_ones(tmp_path):
    path = save_checkpoint(tmp_path, 1, {"trainer": {"global_step": 1}})
    manifest = json.loads((path / MANIFEST).read_text())
    (path / MANIFEST).write_text(json.dumps({**manifest, "format_version": 3}))
    with pytest.raises(CheckpointError, match=r"format_version 3, expected one of 1, 2"):
        verify_checkpoint(path)
    assert (tmp_path / TRACKER).read_text() == "1"


def test_dp_workers_load_the_fsdp2_checkpoint_and_write_one_replica(straight_run, tmp_path):
    root, at_2, loss_3, _, _ = straight_run
    dp = make_trainer(tmp_path, 2, "actor_rollout_ref.actor.strategy=dp")
    try:
        assert dp.load_checkpoint(step_dir(root, 2)) == 2  # each replica takes the rows of both shards
        for name, value in at_2["model"].items():
            assert torch.equal(dp.workers.all("state")[1]["model"][name], value), name
        path = dp.save_checkpoint()
        shards = [f"shard_world_size_2_rank_0_part_{part}.pt" for part in range(FILES_PER_RANK)]
        assert sorted(p.name for p in path.iterdir()) == sorted([MANIFEST, "trainer.pt", *shards])
        loss = dp.train_step(next(dp.loader)).metrics["actor/pg_loss"]
        assert loss == pytest.approx(loss_3, rel=1e-4, abs=1e-6)
        dp.load_checkpoint(path)  # rank 1 reads rank 0's replica
        for name, value in at_2["model"].items():
            assert torch.equal(dp.workers.all("state")[1]["model"][name], value), name
    finally:
        dp.shutdown()


def test_a_shard_the_driver_cannot_see_fails_the_save_and_leaves_no_checkpoint(tmp_path):
    def elsewhere(directory):  # what a worker on a node without the shared directory reports
        return {"files": {"shard.pt": {"bytes": 10, "sha256": "0" * 64}},
                "shards": {"strategy": "fsdp2", "world_size": 1, "files": {}}}

    with pytest.raises(CheckpointError, match=r"shard.pt: a worker wrote 10 bytes there, but this process finds no file"):
        save_checkpoint(tmp_path, 1, {"trainer": {"global_step": 1}}, write_shards=elsewhere)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rlbench.lock"]


def test_a_file_that_disagrees_with_its_spans_is_refused_naming_it(tmp_path):
    write_torch_file(tmp_path / "a.pt", {"tensors": {"w": torch.zeros(2, 2)}})
    with pytest.raises(CheckpointError, match=r"a.pt: w should be 3 rows of \[5, 2\] by the manifest, found \[2, 2\]"):
        ShardSources([(tmp_path / "a.pt", _spans(range(0, 3)))]).fill("w", torch.zeros(5, 2))
