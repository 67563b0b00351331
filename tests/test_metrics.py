"""The metric-family table and the single definitions that read it."""

from __future__ import annotations

from dataclasses import fields

import pytest

from pytest_rlbench.records import metrics
from pytest_rlbench.records.record import BaselineError, ModelArch, record_from_dict
from pytest_rlbench.records.workload import MODEL_KEYS
from pytest_rlbench.verdict import compare, derived, gate_basis, noise
from trainer.models.flops import DecoderArch, flops_params
from trainer.phases import PHASE_KEYS


def test_every_family_has_a_unit_label_and_phases_that_are_phase_keys() -> None:
    assert metrics.METRIC_FAMILIES == (
        "timing_s", "timing_per_token_ms", "tokens_per_s_per_gpu", "mfu", "checkpoint_gb_per_s_per_gpu", "bandwidth_util"
    )
    for family in metrics.FAMILIES.values():
        assert family.unit and family.label
        assert set(family.phases) <= set(PHASE_KEYS), family.name
        if family.counts_tokens:
            assert set(family.phases) <= set(metrics.TOKEN_BASIS), family.name
    judged = {family for gated, _ in gate_basis.BASIS_FAMILIES.values() for family in gated}
    assert judged <= set(metrics.METRIC_FAMILIES)  # the one table of what a gate judges
    assert metrics.REFERENCE_FAMILIES == (
        "timing_s", "tokens_per_s_per_gpu", "mfu", "checkpoint_gb_per_s_per_gpu", "bandwidth_util"
    )
    assert set(metrics.FAMILIES["mfu"].phases) == set(derived.MFU_PASSES)


def test_labels_and_values_as_the_reports_print_them() -> None:
    assert metrics.metric_label("timing_s/gen") == "gen seconds"
    assert metrics.metric_label("tokens_per_s_per_gpu/step") == "step tokens/s per GPU"
    assert metrics.metric_label("peak_memory_gb") == "peak_memory_gb"
    assert metrics.family_label("mfu/update_actor") == "MFU"
    assert metrics.format_value(0.4123, "fraction") == "41.2%"
    assert metrics.format_value(4.1e-8, "fraction") == "under 0.1%"  # not 0.0%: a tiny model's MFU
    assert metrics.format_value(0.0006, "fraction") == "0.1%"
    assert metrics.format_value(0.0, "fraction") == "0.0%"
    assert metrics.format_value(1.3249, "s") == "1.32 s"
    assert metrics.format_value(None, "s") == "-"


def test_one_default_tolerance() -> None:
    assert compare.compare.__defaults__ == (noise.DEFAULT_TOLERANCE,)


def test_the_default_tolerance_is_015_on_cpu_and_010_on_gpus() -> None:
    cpu, gpu = noise.default_tolerance(gpu=False), noise.default_tolerance(gpu=True)
    assert (cpu, gpu) == (0.15, 0.10) and isinstance(cpu, noise.DefaultTolerance)


def test_the_architecture_fields_are_defined_once() -> None:
    decoder = [f.name for f in fields(DecoderArch)]
    assert [f.name for f in fields(ModelArch)] == ["name", *decoder, "model_type", "dtype"]
    assert MODEL_KEYS == (*decoder, "dtype")
    tiny = ModelArch(name="t", num_layers=1, hidden_size=2, intermediate_size=4, num_heads=1, num_kv_heads=1,
                     head_dim=2, vocab_size=3)
    assert isinstance(tiny, DecoderArch) and flops_params(tiny) == 52  # the record's model is the trainer's arch
    assert tiny.to_dict() == {name: getattr(tiny, name) for name in decoder}


def test_the_architecture_bounds_still_reach_the_record_validator() -> None:
    data = {
        "format_version": 1, "name": "x", "provenance": {"source": "t"},
        "hardware": {"device": "cpu", "nodes": 1, "world_size": 1},
        "model": {"name": "m", "num_layers": 0, "hidden_size": 2, "intermediate_size": 4, "num_heads": 1,
                  "num_kv_heads": 1, "head_dim": 2, "vocab_size": -3},
        "config": {},
    }
    with pytest.raises(BaselineError) as caught:
        record_from_dict(data)
    message = str(caught.value)
    assert "$.model.num_layers: expected a number > 0, found 0" in message
    assert "$.model.vocab_size: expected a number > 0, found -3" in message
