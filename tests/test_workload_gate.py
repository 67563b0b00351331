"""Gates against published baselines: on the same per-GPU work only, by throughput on the same GPU
model and by efficiency on another; references on any other work."""

from __future__ import annotations

import dataclasses

import pytest
from replay_records import H100, H200, replay_record

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.record import record_from_dict, record_to_dict
from pytest_rlbench.reports.json_report import build_report
from pytest_rlbench.reports.terminal import terminal_lines
from pytest_rlbench.verdict.compare import compare
from pytest_rlbench.verdict.derived import derive
from pytest_rlbench.verdict.gate_basis import EFFICIENCY, PER_GPU, SAME_MACHINE, gpu_family

VERL = load_baseline("verl-v0.5.0-1.5b")
RLINF = load_baseline("rlinf-1.5b")
PUBLISHED_PHASES = ("gen", "old_log_prob", "update_actor", "step")


def rows(result) -> dict:
    return {c.metric: c for c in result.comparisons}


def gated(result) -> dict:
    return {c.metric: c for c in result.comparisons if c.verdict != "reference"}


def test_gpu_names_are_compared_by_model() -> None:
    assert gpu_family("NVIDIA H100 80GB HBM3") == gpu_family("h100") == gpu_family("H100 PCIe") == "h100"
    assert gpu_family("NVIDIA H200") == "h200" != gpu_family("H100")
    assert gpu_family(None) is None and gpu_family("Some GPU") == "some gpu"


@pytest.mark.parametrize("baseline", [VERL, RLINF], ids=lambda b: b.name)
def test_a_replay_on_the_same_gpu_model_is_gated_on_per_gpu_throughput(baseline) -> None:
    result = compare(replay_record(baseline, H100, world_size=1, speedup=2.0), baseline)
    assert (result.mode, result.basis, result.mismatches) == ("gate", PER_GPU, ())
    assert set(gated(result)) == {f"tokens_per_s_per_gpu/{p}" for p in PUBLISHED_PHASES}
    assert all(c.verdict == "pass" for c in gated(result).values()) and result.passed
    # the times are listed beside, on the same per-GPU work
    assert rows(result)["timing_s/step"].verdict == "reference"
    assert rows(result)["timing_s/step"].ratio == pytest.approx(0.5)


def test_the_gate_takes_the_per_gpu_reading_the_consistency_checks_support() -> None:
    gen = rows(compare(replay_record(VERL), VERL))["tokens_per_s_per_gpu/gen"]
    assert gen.baseline == pytest.approx(
        3496.48, abs=0.01
    )  # 512 sequences over 8 GPUs, not the published 6,993
    assert gen.ratio == pytest.approx(2.0, rel=1e-3)


def test_a_slower_replay_fails_and_its_verdict_names_everything() -> None:
    result = compare(replay_record(VERL, speedup=0.8), VERL)
    assert not result.passed
    gen = rows(result)["tokens_per_s_per_gpu/gen"]
    assert (gen.verdict, gen.reason, gen.tolerance) == ("fail", "lower", 0.1)
    assert gen.ratio == pytest.approx(0.8, rel=1e-3)
    assert gen.message.startswith(
        "gen tokens/s per GPU: 2,797 tokens/s/GPU vs 3,496 tokens/s/GPU in baseline 'verl-v0.5.0-1.5b' "
        "(ratio 0.80, tolerance 0.10): lower (rests on one figure: the baseline has a single value, so no "
        "rank test); seconds "
    )
    assert "; rests on " in gen.message
    for name in (
        "hardware.gpu_model",
        "samples_per_prompt",
        "response_length.shape",
        "response_length.sigma",
    ):
        assert name in gen.message
    assert any(a.startswith("response_length.sigma = 0.5 (not published") for a in gen.assumptions)
    assert (
        "hardware.gpu_model: the baseline's 'H100' read as the run's 'NVIDIA H100 80GB HBM3'"
        in gen.assumptions[0]
    )
    assert gen.assumptions == result.assumptions


def test_a_replay_on_more_gpus_is_the_same_per_gpu_work() -> None:
    result = compare(replay_record(VERL, world_size=8), VERL)
    assert (result.mode, result.basis) == ("gate", PER_GPU) and result.passed


def test_a_replay_on_another_gpu_model_is_gated_on_efficiency() -> None:
    result = compare(replay_record(VERL, H200, speedup=2.0), VERL)
    assert (result.mode, result.basis) == ("gate", EFFICIENCY)
    assert set(gated(result)) == {"bandwidth_util/gen", "mfu/old_log_prob", "mfu/update_actor"}
    mfu = gated(result)["mfu/update_actor"]
    assert mfu.baseline == pytest.approx(0.2304, abs=1e-4)  # from the baseline's time and workload
    assert mfu.ratio == pytest.approx(2.0, rel=1e-2)  # H200 and H100 have the same peak bf16 FLOP/s
    bandwidth = gated(result)["bandwidth_util/gen"]
    assert bandwidth.ratio == pytest.approx(2.0 * 3.35 / 4.8, rel=1e-2)  # H200 has 4.8 TB/s, H100 SXM 3.35
    assert any("taken as 'H100 SXM'" in a for a in result.assumptions)
    assert any(
        a.startswith("parallelism: the rollout's tensor-parallel size taken as 1") for a in result.assumptions
    )
    assert rows(result)["tokens_per_s_per_gpu/gen"].verdict == "reference"
    slow = compare(replay_record(VERL, H200, speedup=0.5), VERL)
    assert {c.metric for c in slow.failures} == set(gated(result))


def _changed(run, path: str, value):
    data = record_to_dict(run)
    node = data["workload"]
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    node[last]["value"] = value
    if path == "sequences_per_gpu":
        data["workload"]["sequences_per_step"]["value"] = value * run.hardware.world_size
    return record_from_dict(data)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("response_length.mean", 1024.0),
        ("response_length.max", 1024),
        ("sequences_per_gpu", 8),
        ("samples_per_prompt", 4),
        ("prompt_length.mean", 256.0),
        ("use_kl_loss", False),
        ("gradient_checkpointing", False),
        ("ppo_epochs", 2),
    ],
)
@pytest.mark.parametrize("gpu", [H100, H200])
def test_never_a_gate_on_other_work(path: str, value, gpu: str) -> None:
    # faster than the baseline by 10x: a gate would pass; other work must give references only
    run = _changed(replay_record(VERL, gpu, speedup=10.0), path, value)
    result = compare(run, VERL)
    assert result.mode == "reference" and result.basis == ""
    assert {c.verdict for c in result.comparisons} == {"reference"}
    assert any(m.startswith(f"workload.{path}") for m in result.mismatches)


@pytest.mark.parametrize(("path", "value"), [("param_offload", True), ("optimizer_offload", True)])
def test_memory_placed_otherwise_still_gates_and_says_so(path: str, value) -> None:
    # where parameters or optimizer state wait between phases is how a framework fits the work, not work
    run = _changed(replay_record(VERL, H100, speedup=0.5), path, value)
    result = compare(run, VERL)
    assert (result.mode, result.basis) == ("gate", PER_GPU) and not result.passed
    failed = rows(result)["tokens_per_s_per_gpu/gen"]
    assert f"memory placed otherwise ({path}: run True, baseline False (memory placement, not work))" in failed.message


def test_a_baseline_that_names_no_gpu_gates_on_its_assumed_one_and_lists_it() -> None:
    seven = load_baseline("verl-7b")  # "8 nodes x 8 GPUs": the model is assumed (workload.gpu_model)
    assert seven.hardware.gpu_model is None and seven.workload.gpu_model.source == "assumed"
    result = compare(replay_record(seven, H100, world_size=4, speedup=0.5), seven)
    assert (result.mode, result.basis) == ("gate", PER_GPU) and not result.passed
    assert any(a.startswith("hardware.gpu_model = 'H100' (not stated") for a in result.assumptions)
    assert all("gpu_model" in c.message for c in result.comparisons)
    unnamed = dataclasses.replace(seven, workload=dataclasses.replace(seven.workload, gpu_model=None))
    result = compare(replay_record(seven, H100, world_size=4, speedup=10.0), unnamed)
    assert result.mode == "reference"
    assert result.mismatches == ("hardware.gpu_model: not stated in the baseline",)


def test_never_a_gate_on_another_model_or_on_cpu() -> None:
    seven = load_baseline("verl-7b")
    result = compare(replay_record(seven, H100, world_size=2, speedup=10.0), VERL)
    assert result.mode == "reference" and any(m.startswith("model: ") for m in result.mismatches)
    cpu = compare(replay_record(VERL, None, speedup=10.0), VERL)
    assert cpu.mode == "reference" and "hardware.device: the run is not a GPU run" in cpu.mismatches


def test_a_saved_baseline_gates_as_before_and_per_gpu_on_another_gpu_count() -> None:
    saved = replay_record(VERL, H100, world_size=1, speedup=2.0, name="local-h100")
    same = compare(replay_record(VERL, H100, world_size=1, speedup=2.0), saved)
    assert (same.mode, same.basis) == ("gate", SAME_MACHINE) and same.assumptions == ()
    assert "timing_s/step" in gated(same)  # the same-machine gate judges times too, as before
    slower = compare(replay_record(VERL, H100, world_size=1, speedup=1.5), saved)
    # one verdict per measurement: the times fail, their throughputs are listed beside them
    assert {c.reason for c in slower.failures} == {"slower"}
    wider = compare(replay_record(VERL, H100, world_size=8, speedup=2.0), saved)
    assert (wider.mode, wider.basis) == ("gate", PER_GPU) and wider.passed
    assert wider.assumptions == ()  # a run's own workload is all published


def test_the_reports_list_the_assumptions_beside_the_verdict() -> None:
    run = replay_record(VERL, speedup=0.8)
    results = [compare(run, VERL)]
    lines = terminal_lines(results)
    assert lines[0].endswith("gate, 4 of 4 failed")  # the 4 gated throughputs; their times beside
    assert lines[1] == f"  gated on {PER_GPU}"
    assert lines[2].startswith("  rests on ") and lines[2].endswith("assumed value(s):")
    assert any(line.startswith("    - samples_per_prompt = 16 (rollout.n not stated") for line in lines)
    report = build_report(run, results)
    entry = report["baselines"][0]
    assert entry["basis"] == PER_GPU and entry["assumptions"] == list(results[0].assumptions)
    assert report["comparisons"][1]["assumptions"] == list(results[0].assumptions)
    assert report["run"]["workload"]["response_length"]["shape"]["value"] == "lognormal"


def test_a_workload_gate_is_no_gate_once_the_baseline_loses_its_workload() -> None:
    bare = dataclasses.replace(VERL, workload=None)
    result = compare(replay_record(VERL, speedup=10.0), bare)
    assert (
        result.mode == "reference"
        and "config.train_batch_size: not stated in the baseline" in result.mismatches
    )


def test_a_phase_timed_inside_the_step_is_gated_and_says_where_it_was_timed() -> None:
    run = replay_record(VERL, H100, speedup=0.5)
    inside = {k: dataclasses.replace(p, inside_step=True) if k != "step" else p for k, p in run.phases.items()}
    result = compare(dataclasses.replace(run, phases=inside), VERL)
    gen, step = rows(result)["tokens_per_s_per_gpu/gen"], rows(result)["tokens_per_s_per_gpu/step"]
    assert gen.verdict == "fail" and "; timed inside the step, as VERL times it" in gen.message
    assert step.verdict == "fail" and "timed inside the step" not in step.message  # its own benchmark


def test_a_same_machine_gate_names_memory_placed_otherwise_and_a_baseline_timed_inside_the_step() -> None:
    saved = replay_record(VERL, H100, world_size=1, speedup=2.0, name="local-h100")
    inside = {k: dataclasses.replace(p, inside_step=k != "step") for k, p in saved.phases.items()}
    saved = dataclasses.replace(saved, phases=inside)  # saved from a session of whole steps alone
    run = _changed(replay_record(VERL, H100, world_size=1, speedup=1.0), "param_offload", True)
    result = compare(run, saved)
    assert (result.mode, result.basis) == ("gate", SAME_MACHINE) and not result.passed
    gen = rows(result)["timing_s/gen"]
    assert gen.verdict == "fail"
    assert "; the baseline's was timed inside the step, this run's by a benchmark of its own" in gen.message
    assert "memory placed otherwise (param_offload: run True, baseline False" in gen.message


def test_an_assumed_gpu_model_is_read_only_for_the_gate_it_allows() -> None:
    seven = load_baseline("verl-7b")
    result = compare(replay_record(VERL, H100, speedup=2.0), seven)  # another model: a reference
    assert result.mode == "reference"
    # no efficiency figure of the baseline computed on a GPU model it does not state
    assert all(c.baseline is None for c in result.comparisons if c.metric.startswith(("mfu/", "bandwidth_util/")))


def without_slowest_shares(run):
    """The run as one that generated shares 0 .. W-1 (target_lengths.slowest_of 0, as before it existed)."""
    settings = {k: v for k, v in run.config.settings.items() if k != "slowest_of"}
    return dataclasses.replace(run, config=dataclasses.replace(run.config, settings=settings))


def with_step0_slowest_share(run):
    """The run's tokens as its first step's rows: the slowest of VERL's 8 shares at step 0."""
    from pytest_rlbench.records.replay_draws import ReplayLayouts, group_targets
    from trainer.rollout.requests import rollout_seed

    layouts, seed = ReplayLayouts.of(VERL), rollout_seed(1, 0)
    slowest = max(layouts.shares(VERL.model, seed), key=lambda d: d.bound_s)
    lengths = group_targets(layouts.spec, slowest.worker * layouts.prompts_per_share, layouts.prompts_per_share, seed)
    prompt = layouts.spec["data.synthetic_prompt_length"]
    tokens = dataclasses.replace(
        run.tokens, prompt_lengths=[prompt] * len(lengths), response_lengths=lengths, response_tokens=sum(lengths),
        prompt_tokens=prompt * len(lengths), response_length_mean=sum(lengths) / len(lengths), decode_steps=max(lengths),
    )
    return dataclasses.replace(run, tokens=tokens)


def test_a_replay_of_the_slowest_share_compares_the_seconds_of_the_baseline_slowest_gpu() -> None:
    """A one-GPU replay of the 8-GPU run generates its slowest share: the baseline's gen and step are read
    over the run's own rows (its seconds for them), its training phases per token."""
    run = with_step0_slowest_share(replay_record(VERL, H100, world_size=1, speedup=1.25))
    assert run.config.settings["slowest_of"] == 8
    result = compare(run, VERL)
    assert (result.mode, result.basis) == ("gate", PER_GPU), result.mismatches
    judged, published = gated(result), derive(VERL)
    for phase in ("gen", "step"):
        row = judged[f"tokens_per_s_per_gpu/{phase}"]
        assert row.ratio == pytest.approx(1.25, rel=1e-9), (phase, row.message)
        # over the slowest share's tokens: more than the 8 GPUs' mean, at the baseline's seconds
        assert row.baseline > published[f"tokens_per_s_per_gpu/{phase}"].value, phase
    for phase in ("old_log_prob", "update_actor"):  # per token, at the baseline's own figure
        metric = f"tokens_per_s_per_gpu/{phase}"
        assert judged[metric].baseline == pytest.approx(published[metric].value, rel=1e-12), phase
    note = [a for a in result.assumptions if a.startswith("replayed_workers:")]
    assert len(note) == 1, result.assumptions
    assert "generated the 1 slowest of the baseline's 8 GPUs' shares" in note[0]
    assert "gen and step figures are read over this run's rows" in note[0]
    ratio = float(note[0].split("trained on x", 1)[1].split(" ", 1)[0])
    assert 1.0 < ratio < 1.2, note[0]  # the slowest share holds more tokens than the mean
    # verl-1.5b's rollout layout is not published: the one-share-per-GPU model rests on it
    assert "rests on parallelism: the rollout's tensor-parallel size taken as 1" in note[0], note[0]
    assert "replayed_workers" in judged["tokens_per_s_per_gpu/gen"].message


def test_a_slower_replay_of_the_slowest_share_fails_on_seconds() -> None:
    result = compare(with_step0_slowest_share(replay_record(VERL, H100, world_size=1, speedup=0.8)), VERL)
    gen = gated(result)["tokens_per_s_per_gpu/gen"]
    assert (gen.verdict, gen.ratio) == ("fail", pytest.approx(0.8, rel=1e-9)), gen.message


def test_a_replay_of_the_first_shares_is_no_gate() -> None:
    """Shares 0 .. W-1 wait only for the slowest of their own: less than the baseline's step did."""
    result = compare(without_slowest_shares(replay_record(VERL, H100, world_size=1)), VERL)
    assert result.mode == "reference", result.basis
    assert "workload: actor_rollout_ref.rollout.target_lengths.slowest_of: run 0 (gpus_per_share 1), a replay of the baseline sets 8 (gpus_per_share 1)" in (
        " ".join(result.mismatches)
    ), result.mismatches


def test_the_shares_a_run_generated_are_part_of_its_work() -> None:
    """A saved replay of the slowest share as a baseline: a rerun of other shares is no gate, on the same
    machine or per GPU, and a replay of it generates the same share again."""
    from pytest_rlbench.records.workload_replay import workload_overrides

    saved = dataclasses.replace(replay_record(VERL, H100, world_size=1), name="saved")  # slowest_of 8
    settings = {s.key: s.value for s in workload_overrides(saved, 1)}
    assert settings["actor_rollout_ref.rollout.target_lengths.slowest_of"] == 8
    rerun = dataclasses.replace(replay_record(VERL, H100, world_size=1), name="rerun")
    assert compare(rerun, saved).mode == "gate"
    other = compare(without_slowest_shares(rerun), saved)
    assert other.mode == "reference", other.basis
    assert any("slowest_of" in m for m in other.mismatches), other.mismatches


def test_shares_chosen_where_the_baseline_is_not_modelled_are_no_gate() -> None:
    """RLinf's 1.5B decoded with tensor parallelism: a run that set slowest_of anyway did other rows."""
    run = replay_record(RLINF, H100, world_size=1)
    assert "slowest_of" not in run.config.settings
    assert compare(run, RLINF).mode == "gate"
    chosen = dataclasses.replace(
        run, config=dataclasses.replace(run.config, settings={**run.config.settings, "slowest_of": 8})
    )
    result = compare(chosen, RLINF)
    assert result.mode == "reference" and any("slowest_of: run 8 (gpus_per_share 1), a replay of the baseline sets 0 (gpus_per_share 1)" in m for m in result.mismatches)


def test_phases_the_run_did_not_time_keep_the_baselines_own_figures() -> None:
    """A gen-only replay: the baseline's step is not read over the run's rows (it has no step of its own)."""
    run = with_step0_slowest_share(replay_record(VERL, H100, world_size=1, speedup=1.25))
    run = dataclasses.replace(run, phases={"gen": run.phases["gen"]})
    result = compare(run, VERL)
    step = rows(result)["tokens_per_s_per_gpu/step"]
    assert step.baseline == pytest.approx(derive(VERL)["tokens_per_s_per_gpu/step"].value, rel=1e-12), step.message


def test_a_replay_on_as_many_gpus_or_at_constant_lengths_has_no_slowest_worker_left_out() -> None:
    on_eight = compare(replay_record(VERL, H100, world_size=8), VERL)
    assert not [a for a in on_eight.assumptions if a.startswith("replayed_workers:")], on_eight.assumptions
    w = VERL.workload
    shape = dataclasses.replace(w.response_length.shape, value="constant")
    constant = dataclasses.replace(
        VERL, workload=dataclasses.replace(w, response_length=dataclasses.replace(w.response_length, shape=shape, sigma=None))
    )
    from pytest_rlbench.records.replay_draws import slowest_worker_note

    assert slowest_worker_note(replay_record(VERL, H100, world_size=1), constant) == []


def test_a_tensor_parallel_rollout_is_named_without_a_factor() -> None:
    """RLinf's 1.5B run decoded with tp 2 (4 replicas on 8 GPUs): the draw model does not cover it."""
    from pytest_rlbench.records.replay_draws import slowest_worker_note

    note = slowest_worker_note(replay_record(RLINF, H100, world_size=1), RLINF)
    assert len(note) == 1 and "not modelled for this baseline's lengths or rollout layout" in note[0], note
    assert "about x" not in note[0]


def test_a_replay_of_a_tensor_parallel_rollout_generates_its_slowest_replicas_shares() -> None:
    """VERL's 7B decoded with rollout tp 2 (32 replicas of 64 rows): on 4 GPUs the replay generates the 2
    slowest replicas' shares, 2 GPUs each, and its gen is read over those rows at VERL's seconds."""
    seven = load_baseline("verl-7b")
    run = replay_record(seven, H100, world_size=4, speedup=1.25)
    assert (run.config.settings["slowest_of"], run.config.settings["gpus_per_share"]) == (32, 2)
    result = compare(run, seven)
    assert (result.mode, result.basis) == ("gate", PER_GPU), result.mismatches
    gen = gated(result)["tokens_per_s_per_gpu/gen"]
    assert gen.ratio == pytest.approx(1.25, rel=1e-9), gen.message
    note = [a for a in result.assumptions if a.startswith("replayed_workers:")]
    assert len(note) == 1 and "the 2 slowest of the baseline's 32 decode replicas' shares (of 2 GPUs each" in note[0], note
    # on 2 GPUs: one share over both; a share of 2 GPUs does not split over an odd count
    assert replay_record(seven, H100, world_size=2).config.settings["slowest_of"] == 32
    from pytest_rlbench.records.workload_replay import expected_shares

    assert expected_shares(seven, 3) == (0, 1) and expected_shares(seven, 8) == (32, 2)


def test_a_saved_tensor_parallel_replay_is_not_gated_on_a_gpu_count_that_splits_no_share() -> None:
    """A saved 4-GPU replay of RLinf's 1.5B (rollout tp 2: shares of 2 GPUs) against a one-GPU run: the
    replay of it sets its shares again, which one GPU cannot hold, so no gate on other rows."""
    from pytest_rlbench.records.workload_replay import expected_shares

    saved = dataclasses.replace(replay_record(RLINF, H100, world_size=4), name="saved")
    assert (saved.config.settings["slowest_of"], saved.config.settings["gpus_per_share"]) == (4, 2)
    assert expected_shares(saved, 1) == (4, 2) and expected_shares(saved, 2) == (4, 2)
    assert expected_shares(saved, 8) == (0, 1)  # every share
    one = replay_record(RLINF, H100, world_size=1)  # shares 0 .. 0 of its own
    result = compare(one, saved)
    assert result.mode == "reference" and any("slowest_of" in m for m in result.mismatches), result.mismatches
    two = replay_record(RLINF, H100, world_size=2)
    gate = compare(two, saved)
    note = [a for a in gate.assumptions if a.startswith("replayed_workers:")]
    assert gate.mode == "gate" and note and "(a saved replay) generated the slowest of the same 4 shares" in note[0], note


def test_the_tensor_parallel_layout_is_named_in_the_line() -> None:
    seven = load_baseline("verl-7b")
    result = compare(replay_record(seven, H100, world_size=4), seven)
    note = next(a for a in result.assumptions if a.startswith("replayed_workers:"))
    assert "reading all the weights at each decode step where each of the baseline's 2 GPUs read 1/2" in note
    # decoded tensor-parallel as the baseline's replicas were (rollout.tensor_model_parallel_size=2)
    run = replay_record(seven, H100, world_size=4)
    run = dataclasses.replace(run, config=dataclasses.replace(run.config, parallelism={"dp": 4, "rollout_tp": 2}))
    note = next(a for a in compare(run, seven).assumptions if a.startswith("replayed_workers:"))
    assert "each share was decoded by its 2 GPUs together at tensor-parallel size 2" in note, note
    assert "reading all the weights" not in note


def test_an_offloaded_optimizer_sharded_over_fewer_gpus_is_named() -> None:
    """VERL's 7B offloaded its optimizer state, sharded over 64 GPUs. A 2-GPU replay that keeps its
    parameters on the GPUs copies half of the moments in and out in each update_actor call, 32x the
    bytes each of VERL's GPUs copied: named, as a reason update_actor reads slow. Where no moments
    move, no line."""
    seven = load_baseline("verl-7b")
    moved = replay_record(seven, H100, world_size=2, overrides=["actor_rollout_ref.actor.fsdp_config.param_offload=False"])
    result = compare(moved, seven)
    assert result.mode == "gate", result.mismatches
    note = [a for a in result.assumptions if a.startswith("offload_sharding:")]
    assert len(note) == 1, result.assumptions
    assert "copies 1/2 of AdamW's moments to the GPU and back in each update_actor call" in note[0], note
    assert "each of the baseline's copied 1/64" in note[0], note
    assert "32x the bytes per GPU" in note[0], note
    # as published (param_offload too): AdamW steps on the host, and the moments never move
    as_published = compare(replay_record(seven, H100, world_size=2), seven)
    assert not [a for a in as_published.assumptions if a.startswith("offload_sharding:")], as_published.assumptions
    # a baseline that kept its optimizer on the GPU: the placement line names the difference instead
    kept = dataclasses.replace(
        seven, workload=dataclasses.replace(seven.workload, optimizer_offload=dataclasses.replace(
            seven.workload.optimizer_offload, value=False))
    )
    assert not [a for a in compare(moved, kept).assumptions if a.startswith("offload_sharding:")]
    one = compare(replay_record(RLINF, H100, world_size=1), RLINF)  # the 1.5B kept its optimizer on the GPU
    assert not [a for a in one.assumptions if a.startswith("offload_sharding:")], one.assumptions


def _saved(run, written: float):
    """``run`` with a save that wrote ``written`` bytes (as a step that saves reports them)."""
    from pytest_rlbench.records.record import Metric
    from trainer.phases import CHECKPOINT_BYTES

    return dataclasses.replace(run, metrics={**run.metrics, CHECKPOINT_BYTES: Metric([written], "B", False)})


@pytest.mark.parametrize(("gpu", "basis"), [(H100, PER_GPU), (H200, EFFICIENCY)])
def test_a_save_of_the_same_work_is_gated_on_the_gb_written_per_second_per_gpu(gpu: str, basis: str) -> None:
    """VERL's 7B published its save (6.6 s) and not its size: the baseline's bytes are its workload's
    12 bytes per parameter (assumed), each of its 64 GPUs writing 1/64, 8 a node; a run's are the bytes
    it wrote. On 8 GPUs of one node writing the same bytes each, the save is the same work per GPU and
    per node: judged on either GPU model (a host's storage pace). A run that did not record its bytes
    fails on the missing figure rather than passing on a time."""
    from trainer.models.flops import parameter_count

    seven = load_baseline("verl-7b")
    written = 12 * parameter_count(seven.model) * 8 / 64  # VERL's bytes per GPU, on 8
    run = replay_record(seven, gpu, world_size=8, speedup=1.25)
    result = compare(_saved(run, written), seven)
    assert (result.mode, result.basis) == ("gate", basis), result.mismatches
    rate = gated(result)["checkpoint_gb_per_s_per_gpu/save_checkpoint"]
    assert rate.baseline == pytest.approx(written / 8 / 1e9 / 6.603002, rel=1e-9), rate.message
    assert rate.ratio == pytest.approx(1.25, rel=1e-9) and rate.verdict == "pass", rate.message
    assert not [a for a in result.assumptions if a.startswith("checkpoint_size:")], result.assumptions
    assert any(a.startswith("checkpoint_bytes_per_parameter = 12") for a in result.assumptions)
    slow = replay_record(seven, gpu, world_size=8, speedup=1 / 1.2)
    failed = gated(compare(_saved(slow, written), seven))["checkpoint_gb_per_s_per_gpu/save_checkpoint"]
    assert failed.verdict == "fail" and failed.ratio == pytest.approx(1 / 1.2, rel=1e-9), failed.message
    missing = gated(compare(run, seven))["checkpoint_gb_per_s_per_gpu/save_checkpoint"]
    assert missing.verdict == "fail" and "the bytes a save wrote are not recorded" in missing.message, missing.message


def test_a_save_of_other_work_is_listed_never_judged() -> None:
    """On 4 GPUs each GPU writes 8 times VERL's bytes (here bfloat16 state, 6 bytes a parameter) and a
    node 4 times: per GPU the rate would flatter the replay, per node it would not, and which the
    storage sets is not known. So the save is listed with both sizes, and neither a fast nor a slow one
    decides the gate."""
    from trainer.models.flops import parameter_count

    seven = load_baseline("verl-7b")
    written = 6 * parameter_count(seven.model)
    run = replay_record(seven, H100, world_size=4, speedup=1.25)
    for save_s in (1.0, 100.0):  # 45.7 GB on 4 GPUs: 11.4 and 0.114 GB/s per GPU against VERL's 0.216
        phases = {**run.phases, "save_checkpoint": dataclasses.replace(run.phases["save_checkpoint"], seconds=[save_s])}
        result = compare(_saved(dataclasses.replace(run, phases=phases), written), seven)
        row = rows(result)["checkpoint_gb_per_s_per_gpu/save_checkpoint"]
        assert row.verdict == "reference" and result.passed, (save_s, row.message)
    size = [a for a in result.assumptions if a.startswith("checkpoint_size:")]
    assert len(size) == 1 and size[0].startswith("checkpoint_size: save_checkpoint is listed, not judged"), size
    assert "bytes per GPU: run 11.42 GB, baseline 1.43 GB" in size[0], size
    assert "GPUs sharing a node's storage: run 4, baseline 8" in size[0], size
    assert "(4 a node: 45.7 GB a node; 6.0 bytes a parameter)" in size[0], size


def test_a_run_without_a_save_adds_no_checkpoint_line() -> None:
    seven = load_baseline("verl-7b")
    run = replay_record(seven, H100, world_size=4)
    run = dataclasses.replace(run, phases={k: v for k, v in run.phases.items() if k != "save_checkpoint"})
    result = compare(run, seven)
    assert not [a for a in result.assumptions if a.startswith("checkpoint_size:")]
    assert gated(result)["checkpoint_gb_per_s_per_gpu/save_checkpoint"].verdict == "not run" and result.passed
