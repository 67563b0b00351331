"""Counted work beside a phase's time (``WorkEvidence`` in pytest_rlbench/verdict/judge.py, trainer/work_counts.py):
a session slower alike with more work in a phase fails that phase; with the same work it passes and
says why; a phase within the tolerance that dispatched more and ran slower fails; the counts are
evidence, never judged rows; and what the counters count."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_session_pace import session

from pytest_rlbench.records.record import Metric, RunRecord
from pytest_rlbench.verdict.compare import compare, counted_work, custom_metrics
from pytest_rlbench.verdict.judge import (
    DEVICE_KINDS,
    FLOPS,
    NOT_SIGNIFICANT,
    OPS,
    WORK_ALLOWANCE,
    WorkEvidence,
    with_work,
    work_metric,
)
from trainer.work_counts import COUNTING_ENDS, WorkCounts, count_work, device_counts, profiled_events


def with_counts(record: RunRecord, counts: dict[str, tuple[float, float]]) -> RunRecord:
    """``record`` with each phase's (ops, flops) as its work/* metrics."""
    metrics = dict(record.metrics)
    for phase, (ops, flops) in counts.items():
        metrics[work_metric(OPS, phase)] = Metric(value=[ops], unit="ops", higher_is_better=False)
        metrics[work_metric(FLOPS, phase)] = Metric(value=[flops], unit="FLOP", higher_is_better=False)
    return dataclasses.replace(record, metrics=metrics)


BASE_WORK = {"old_log_prob": (1019, 2.4e9), "ref": (1019, 2.4e9), "update_actor": (3540, 7.1e9)}


def timings(run: RunRecord, base: RunRecord) -> dict[str, object]:
    result = compare(run, base, 0.20)
    assert result.mode == "gate", result.mismatches
    return {c.phase: c for c in result.comparisons if c.metric.startswith("timing_s/")}


def test_a_session_slower_alike_with_more_work_in_a_phase_fails_that_phase() -> None:
    base = with_counts(session("base"), BASE_WORK)
    more = with_counts(session("run", everything=1.3), {**BASE_WORK, "update_actor": (7080, 14.2e9)})
    judged = timings(more, base)
    update = judged["update_actor"]
    assert (update.verdict, update.reason) == ("fail", "more work"), update.message
    assert "ops 3,540 -> 7,080" in update.message and "FLOPs 7.1e+09 -> 1.42e+10" in update.message
    # the pace that excused the time is still named
    assert "session's other phases ran at 1.30x" in update.message
    # the phases whose work did not change pass: the same work ran slower alike, the machine's doing
    ref = judged["ref"]
    assert (ref.verdict, ref.reason) == ("pass", "same work"), ref.message
    assert "the time alone: session slower" in ref.message and "the work was the same (ops 1,019 -> 1,019" in ref.message
    assert "cannot see a slower kernel doing the same work" in ref.message
    # without the counts the same session abstains on update_actor
    assert timings(session("run", everything=1.3), session("base"))["update_actor"].verdict == "inconclusive"


def test_more_work_alone_fails_nothing_and_is_shown_beside_the_time() -> None:
    base = with_counts(session("base"), BASE_WORK)
    run = with_counts(session("run"), {**BASE_WORK, "update_actor": (7080, 14.2e9)})
    update = timings(run, base)["update_actor"]
    assert update.verdict == "pass" and update.message.endswith(
        "; ops 3,540 -> 7,080, FLOPs 7.1e+09 -> 1.42e+10"
    )


def test_more_work_with_rounds_slower_within_the_tolerance_fails() -> None:
    base = with_counts(session("base"), BASE_WORK)
    # update_actor 10% slower (every round past every baseline round), the tolerance 20%
    slower = session("run", {"update_actor": 1.10})
    update = timings(with_counts(slower, {**BASE_WORK, "update_actor": (3560, 7.9e9)}), base)["update_actor"]
    assert (update.verdict, update.reason) == ("fail", "more work"), update.message
    assert "within tolerance, but 10.0% slower than the baseline against the session's pace" in update.message
    assert "FLOPs 7.1e+09 -> 7.9e+09" in update.message
    # one slow baseline round does not hide it: the medians decide, not the rank test
    outlier = with_counts(session("base"), BASE_WORK)
    rounds = list(outlier.phases["update_actor"].seconds)
    rounds[2] *= 1.3
    outlier = dataclasses.replace(
        outlier, phases={**outlier.phases, "update_actor": dataclasses.replace(outlier.phases["update_actor"], seconds=rounds)}
    )
    update = timings(with_counts(slower, {**BASE_WORK, "update_actor": (3560, 7.9e9)}), outlier)["update_actor"]
    assert (update.verdict, update.reason) == ("fail", "more work"), update.message
    # the same rounds with the same work pass: the time alone is within the tolerance
    same = timings(with_counts(slower, BASE_WORK), base)["update_actor"]
    assert (same.verdict, same.reason) == ("pass", "within tolerance"), same.message
    # more work whose rounds are slower only as fast as the whole session is: the session's pace
    alike = with_counts(session("run", everything=1.10), {**BASE_WORK, "update_actor": (3560, 7.9e9)})
    update = timings(alike, base)["update_actor"]
    assert (update.verdict, update.reason) == ("pass", "within tolerance"), update.message


def test_the_counts_are_evidence_never_judged_rows() -> None:
    base = with_counts(session("base"), BASE_WORK)
    run = with_counts(session("run"), {**BASE_WORK, "update_actor": (7080, 14.2e9)})
    assert not any(m.startswith("work/") for m in custom_metrics(run, base))
    assert not any(c.metric.startswith("work/") for c in compare(run, base, 0.20).comparisons)


def test_more_means_past_the_allowance_and_on_both_sides() -> None:
    grown = 1019 * (1 + WORK_ALLOWANCE)
    assert not WorkEvidence({OPS: grown}, {OPS: 1019}).more
    assert WorkEvidence({OPS: grown + 1}, {OPS: 1019}).more
    assert WorkEvidence({OPS: 1019, FLOPS: 3e9}, {OPS: 1019, FLOPS: 2e9}).more  # FLOPs count too
    assert not WorkEvidence({OPS: 1019, FLOPS: 3e9}, {OPS: 1019}).more  # a count one side lacks: no change
    assert WorkEvidence({OPS: 1019, FLOPS: 0}, {OPS: 1019, FLOPS: 0}).same
    assert not WorkEvidence({OPS: 900}, {OPS: 1019}).same  # fewer, past the allowance
    assert WorkEvidence({OPS: 1403}, {OPS: 1401}).same  # fsdp2's update_actor, call to call
    assert not WorkEvidence({OPS: 1403}, {OPS: 1401}).identical
    # a phase counted on one side only is no evidence
    counted, bare = with_counts(session("run"), {"ref": (10, 0)}), session("base")
    assert counted_work(counted, bare, "ref") is None and counted_work(bare, counted, "ref") is None
    assert counted_work(counted, counted, "ref") == WorkEvidence(
        {OPS: 10.0, FLOPS: 0.0}, {OPS: 10.0, FLOPS: 0.0}
    )


def test_the_rule_on_each_verdict() -> None:
    more = WorkEvidence({OPS: 20}, {OPS: 10})
    same = WorkEvidence({OPS: 10}, {OPS: 10})
    fewer = WorkEvidence({OPS: 5}, {OPS: 10})
    for excused in ("session slower", "not reproduced", "GPU clocks"):
        assert with_work("inconclusive", excused, "", more)[:2] == ("fail", "more work")
        assert with_work("inconclusive", excused, "", fewer)[:2] == ("inconclusive", excused)
        passed = with_work("inconclusive", excused, "", same)
        assert passed[:2] == ("pass", "same work") and "the work was the same" in passed[2]
        # a few more ops (gradient checkpointing's wrappers in gen: 16,917 -> 17,109) explain no slower time
        few_more = with_work("inconclusive", excused, "", WorkEvidence({OPS: 17109}, {OPS: 16917}))
        assert (
            few_more[:2] == ("pass", "same work")
            and "the work was within 5% of the baseline's" in few_more[2]
        )
    # an inconclusive that did not find the time slower stays as it was: more work is not a slower time
    assert with_work("inconclusive", "too few rounds", "", more)[:2] == ("inconclusive", "too few rounds")
    # a failure stays a failure (a slower kernel does the same work), with its counts for the record
    assert with_work("fail", "slower", " (p = 0.004)", same) == (
        "fail",
        "slower",
        " (p = 0.004); ops 10 -> 10",
    )
    assert with_work("pass", "within tolerance", "", same) == ("pass", "within tolerance", "")
    assert with_work("pass", "within tolerance", "", None) == ("pass", "within tolerance", "")
    # a pass with more work fails where its median was slower past the noise floor, by however much
    assert with_work("pass", "within tolerance", "", more, slower_by=0.10)[:2] == ("fail", "more work")
    small = with_work("pass", "within tolerance", "", more, slower_by=0.02)
    assert small[:2] == ("fail", "more work") and "2.0% slower than the baseline, past the noise floor" in small[2]
    assert "pace" not in small[2]  # a GPU's figure is not paced
    assert with_work("pass", "within tolerance", "", more, slower_by=None)[:2] == ("pass", "within tolerance")
    assert with_work("pass", "within tolerance", "", same, slower_by=0.10)[:2] == ("pass", "within tolerance")


def test_count_work_counts_dispatched_ops_and_flops() -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    result, work = count_work(lambda: (a @ b).sum())
    assert float(result) == 24.0
    assert work == WorkCounts(ops=2, flops=2 * 2 * 3 * 4)  # mm and sum; FLOPs of the matmul alone
    _, twice = count_work(lambda: [(a @ b).sum() for _ in range(2)])
    assert twice == work + work
    assert count_work(lambda: None)[1] == WorkCounts()


def test_host_calls_from_the_counting_marker_on_are_left_out_and_the_gpus_kept() -> None:
    """profiled_events drops the host's calls made after count_work's COUNTING_ENDS marker (its closing
    syncs, which on a GPU were counted as the phase's: 2 host syncs for a matmul on the CPU), keeps every
    event before it, and drops the marker itself."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        torch.ones(2)
        with record_function(COUNTING_ENDS):
            torch.zeros(2)
    names = [name for name, _, _ in profiled_events(profiler)]
    assert "aten::ones" in names, names
    assert "aten::zeros" not in names and COUNTING_ENDS not in names, names


def test_the_one_counting_mode_counts_what_the_two_stacked_modes_counted() -> None:
    """count_work's one dispatch mode (OpAndFlopCounter) must count as OpCounter stacked over
    FlopCounterMode did, or every baseline saved before it would read as more (or less) work: a
    transformers model's forward and backward (its attention through SDPA with grouped-query heads),
    and the same forward under inference mode, where composite ops (linear, matmul, SDPA) reach the
    mode whole and FlopCounterMode counts them by their decomposition's parts."""
    from trainer.models.presets import build_model
    from trainer.work_counts import OpAndFlopCounter, attention_flop_formulas, stacked_counters

    model = build_model("tiny", seed=0)
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped-query attention
    ids = torch.randint(0, 100, (2, 48), generator=torch.Generator().manual_seed(0))
    weight = torch.randn(32, model.config.vocab_size, generator=torch.Generator().manual_seed(1))

    def forward() -> torch.Tensor:
        logits = model(input_ids=ids).logits
        return torch.nn.functional.gelu(torch.nn.functional.linear(logits, weight)).mean() + (logits @ logits.mT).mean()

    def forward_and_backward() -> torch.Tensor:
        model.zero_grad(set_to_none=True)  # every counted call starts from no gradients
        loss = forward()
        loss.backward()
        return loss

    def inference() -> torch.Tensor:
        with torch.inference_mode():
            return forward()

    for call in (forward_and_backward, inference):
        call()  # warm: lazy state made outside the counts
        _, one = count_work(call)
        _, stacked = count_work(call, stacked_counters)
        assert (one.ops, one.flops) == (stacked.ops, stacked.flops), f"{call.__name__}: one mode {one}, stacked {stacked}"
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        passes = 3 if call is forward_and_backward else 1  # a backward's matmuls are twice the forward's
        assert one.flops >= 2 * passes * linear * ids.numel(), one  # the model's matmuls, at least
    counter = OpAndFlopCounter(attention_flop_formulas())
    with counter:
        inference()
    decomposed = {str(op) for op, parts in counter._decomposable.items() if parts}
    assert {"aten.linear.default", "aten.matmul.default"} <= decomposed, decomposed  # the path was taken


def test_device_counts_file_the_profilers_events_by_what_they_asked_of_the_gpu() -> None:
    events = [  # (name, ran on the GPU, count), as torch's profiler averages them
        ("cudaLaunchKernel", False, 120), ("cuLaunchKernel", False, 30),  # ATen/cuBLAS's, Triton's
        ("cudaGraphLaunch", False, 1024),
        ("ampere_bf16_s16816gemm", True, 5000), ("triton_decode_attention", True, 700),
        ("Memcpy HtoD (Pageable -> Device)", True, 4), ("Memset (Device)", True, 9),  # not kernels
        ("cudaMemcpyAsync", False, 4), ("cudaStreamSynchronize", False, 33), ("cudaDeviceSynchronize", False, 1),
        ("nccl:all_reduce", False, 2), ("nccl:_reduce_scatter_base", False, 28),
        ("aten::mm", False, 800), ("cudaEventRecord", False, 50),  # neither: the ops count aten's
    ]
    assert device_counts(events) == {
        "launches": 150, "graph_replays": 1024, "kernels": 5700, "copies": 4, "syncs": 34, "collectives": 30
    }
    assert set(device_counts(events)) == set(DEVICE_KINDS)  # each count has its words in verdicts


def test_device_counts_add_up_over_workers_and_say_whether_a_gpu_was_counted() -> None:
    gpu = WorkCounts(ops=10, flops=4, launches=7, graph_replays=2, kernels=90, copies=1, syncs=3, collectives=5)
    assert gpu + gpu == WorkCounts(20, 8, 14, 4, 180, 2, 6, 10)
    assert gpu.on_device and not WorkCounts(ops=10, flops=4).on_device
    assert count_work(lambda: torch.ones(2) * 2)[1].launches == 0  # no CUDA here: no profiler, no device counts


def test_a_verdict_names_the_device_counts_that_changed_first() -> None:
    base = {OPS: 3540.0, FLOPS: 7.1e9, "launches": 2310.0, "graph_replays": 1024.0, "syncs": 32.0}
    run = {**base, "launches": 4620.0}
    work = WorkEvidence(run, base)
    # a device count decides as the ops do (each repeated exactly across GPU sessions and machines)
    assert work.more and not work.same
    assert WorkEvidence({**base, "syncs": 33.0}, base).same  # one sync more of 32: within the allowance
    assert WorkEvidence({**base, "syncs": 40.0}, base).more  # 25% more host syncs: the code's
    grown = with_work("inconclusive", "GPU clocks", "", WorkEvidence({**base, "kernels": 3000.0}, {**base, "kernels": 2000.0}))
    assert grown[:2] == ("fail", "more work") and "kernels run 2,000 -> 3,000" in grown[2], grown
    assert work.describe() == (
        "ops 3,540 -> 3,540, FLOPs 7.1e+09 -> 7.1e+09, kernel launches 2,310 -> 4,620, "
        "unchanged: graph replays 1,024, host syncs 32"
    )
    assert WorkEvidence(base, base).identical


def test_counts_of_counted_rounds_that_sampled_other_lengths_do_not_decide() -> None:
    """Where responses end at EOS a counted generation that sampled longer responses dispatches more:
    its counts then say nothing of the code, so a slower gen is judged on its time alone, and its
    verdict says why; the same lengths on both sides and the counts decide again."""
    def generated(record: RunRecord, ops: float, tokens: float) -> RunRecord:
        metrics = dict(with_counts(record, {**BASE_WORK, "old_log_prob": (ops, 2.4e9)}).metrics)
        metrics[work_metric("response_tokens", "old_log_prob")] = Metric(value=[tokens], unit="tokens", higher_is_better=False)
        return dataclasses.replace(record, metrics=metrics)

    base = generated(session("base"), 1019, 8192)
    slower = session("run", {"old_log_prob": 1.10})  # 10% slower, within the 20% tolerance
    longer = timings(generated(slower, 1400, 9000), base)["old_log_prob"]
    assert (longer.verdict, longer.reason) == ("pass", "within tolerance"), longer.message
    assert "response tokens 8,192 -> 9,000" in longer.message and "cannot tell the code from the sampling" in longer.message
    same_length = timings(generated(slower, 1400, 8192), base)["old_log_prob"]
    assert (same_length.verdict, same_length.reason) == ("fail", "more work"), same_length.message
    evidence = counted_work(generated(slower, 1400, 9000), base, "old_log_prob")
    assert evidence is not None and not evidence.comparable and not evidence.more and not evidence.same


def test_counted_work_reads_every_kind_a_session_recorded() -> None:
    counts = {**BASE_WORK}
    base = with_counts(session("base"), counts)
    metrics = dict(base.metrics)
    metrics[work_metric("launches", "update_actor")] = Metric(value=[2310.0], unit="", higher_is_better=False)
    run = dataclasses.replace(base, metrics={**metrics, work_metric("launches", "update_actor"): Metric(
        value=[4620.0], unit="", higher_is_better=False)})
    base = dataclasses.replace(base, metrics=metrics)
    work = counted_work(run, base, "update_actor")
    assert work is not None and work.run["launches"] == 4620.0 and work.base["launches"] == 2310.0
    assert "kernel launches 2,310 -> 4,620" in work.describe() and not work.same


def test_gpu_phases_are_counted_only_where_a_verdict_can_read_the_counts() -> None:
    from types import SimpleNamespace

    from pytest_rlbench.session.bench import counts_matter

    published = session("verl")  # a published run's figures: no work/* metrics
    saved = with_counts(session("ours"), BASE_WORK)

    def state(gpu: bool, save: bool = False, baselines=(), gating: bool = True, replay=None):
        opts = SimpleNamespace(gpu=gpu, save_baseline="b.json" if save else None, baselines=["x"] if baselines else [],
                               workload_record=replay)
        return SimpleNamespace(opts=opts, baseline_records=list(baselines), gating=gating)

    assert not counts_matter(state(gpu=True, baselines=[published]))  # a replay: its long phases are not re-run
    assert counts_matter(state(gpu=True, save=True))
    assert not counts_matter(state(gpu=True, save=True, replay=published))  # a replay's long phases: never
    assert counts_matter(state(gpu=True, baselines=[published, saved]))
    assert not counts_matter(state(gpu=True, baselines=[saved], gating=False))  # references only
    assert counts_matter(state(gpu=False, baselines=[published]))  # CPU: as before, whenever gating
    assert not counts_matter(state(gpu=False))


def test_grouped_query_attention_counts_the_flops_of_its_repeated_heads() -> None:
    """torch before 2.12 (the GPU machines' 2.11) refused to count attention whose key and value have
    fewer heads than the query (its formula asserted equal heads), failing the counted round of every
    GQA model's phase; the tolerant formula counts it as the same attention with each KV head repeated,
    which is what torch 2.12's own formula counts."""
    from torch.utils.flop_counter import flop_registry

    from trainer.work_counts import attention_flop_formulas, grouped_query_tolerant

    def strict(query, key, value, *args, **kwargs):  # an old formula: equal heads or an AssertionError
        assert query.shape[1] == key.shape[1] == value.shape[1], "query/key/value shapes are incompatible"
        return 4 * query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2] * query.shape[3]

    q = torch.empty(2, 12, 64, 32, device="meta")
    kv = torch.empty(2, 2, 80, 32, device="meta")
    repeated = torch.empty(2, 12, 80, 32, device="meta")
    assert grouped_query_tolerant(strict, 0, -3)(q, kv, kv) == strict(q, repeated, repeated) == 4 * 2 * 12 * 64 * 80 * 32
    grad = torch.empty(2, 12, 64, 32, device="meta")  # a backward's arguments start with the output's gradient
    assert grouped_query_tolerant(lambda g, *a, **k: strict(*a), 1, -3)(grad, q, kv, kv) == strict(q, repeated, repeated)
    forward = torch.ops.aten._scaled_dot_product_flash_attention
    formulas = attention_flop_formulas()
    assert formulas[forward](q, kv, kv) == flop_registry[forward](q, repeated, repeated) > 0
    assert torch.ops.aten._flash_attention_backward in formulas


def test_the_tolerant_formula_counts_a_grouped_query_call_that_the_old_formula_refuses(monkeypatch) -> None:
    """End to end through FlopCounterMode: with torch 2.11's kind of formula (equal heads or an
    AssertionError) in the registry, a GQA attention op fails plain FlopCounterMode and is counted,
    as the repeated-heads equal, under count_work's custom mapping (the op's arguments reach it raw)."""
    from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count, shape_wrapper

    from trainer.work_counts import attention_flop_formulas

    def old_formula(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
        assert query_shape[1] == key_shape[1] == value_shape[1], "query/key/value shapes are incompatible"
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    op = torch.ops.aten._scaled_dot_product_efficient_attention
    monkeypatch.setitem(flop_registry, op, shape_wrapper(old_formula))
    q = torch.empty(2, 12, 64, 32, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(2, 2, 64, 32, device="meta", dtype=torch.bfloat16)
    repeated = torch.empty(2, 12, 64, 32, device="meta", dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="incompatible"), FlopCounterMode(display=False):
        op(q, kv, kv, None, False)
    with FlopCounterMode(display=False, custom_mapping=attention_flop_formulas()) as tolerant:
        op(q, kv, kv, None, False)
    with FlopCounterMode(display=False) as plain:
        op(q, repeated, repeated, None, False)
    assert tolerant.get_total_flops() == plain.get_total_flops() == 4 * 2 * 12 * 64 * 64 * 32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device counters run where CUDA has started")
def test_the_device_counters_see_launches_graph_replays_and_syncs_on_a_gpu(tok, prompts, liven) -> None:
    from trainer.models.presets import build_model
    from trainer.rollout import FastRolloutEngine, SamplingParams

    engine = FastRolloutEngine(liven(build_model("tiny", seed=0)).to("cuda", torch.bfloat16), tok)

    def generate():
        return engine.generate(prompts, list(range(len(prompts))), [], 2, 64, SamplingParams(), 3)

    generate()
    generate()  # graphs met once are captured the second time: the third call replays them
    _, first = count_work(generate)
    _, again = count_work(generate)
    assert first.on_device and first.graph_replays > 0 and first.launches > 0 and first.syncs > 0, first
    assert first.kernels > first.launches, first  # the kernels inside the replayed graphs count as run
    assert again == first, (first, again)


def test_a_time_past_the_tolerance_but_not_significant_fails_with_more_work_only() -> None:
    # what the rank test of 5 rounds left a pass ("not significant", past the tolerance and the floor)
    why = " (p = 0.075 >= 0.01, 5 vs 5 rounds)"
    more = WorkEvidence({OPS: 1070, FLOPS: 3.08e9}, {OPS: 1019, FLOPS: 2.38e9})
    same = WorkEvidence({OPS: 1019, FLOPS: 2.38e9}, {OPS: 1019, FLOPS: 2.38e9})
    verdict, reason, detail = with_work("pass", NOT_SIGNIFICANT, why, more, None)
    assert (verdict, reason) == ("fail", "more work"), detail
    assert "past the tolerance in seconds" in detail and "ops 1,019 -> 1,070" in detail, detail
    # the same work leaves it a pass: the counts say nothing changed
    assert with_work("pass", NOT_SIGNIFICANT, why, same, None)[:2] == ("pass", NOT_SIGNIFICANT)
    # more work within the tolerance and not slower past the floor is no failure either
    assert with_work("pass", "within tolerance", "", more, None)[:2] == ("pass", "within tolerance")
