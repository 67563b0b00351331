"""Run records: the built-in baselines load, invalid files are refused with every problem named, round trips."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from shared_parts import tiny_record

from pytest_rlbench.records.baselines import BUILTIN_BASELINES, baseline_dirs, load_baseline, resolve_baseline
from pytest_rlbench.records.record import (
    BaselineError,
    PhaseRecord,
    TokenCounts,
    dumps_record,
    load_record,
    record_from_dict,
    record_to_dict,
    save_record,
    validate,
)

REPO_BASELINES = Path(__file__).resolve().parent.parent / "baselines"

VALID = tiny_record(
    "local-ci",
    {"device": "gpu", "nodes": 1, "gpus_per_node": 2, "world_size": 2, "gpu_model": "NVIDIA H100 80GB HBM3"},
    {"gen": {"seconds": [1.5, 1.25, 1.75]}, "step": {"seconds": 4.0}},
    tokens={"prompt_lengths": [3, 4, 5, 6], "response_lengths": [10, 12, 14, 16], "decode_steps": 16},
)


def test_builtin_baselines_load_and_hold_the_published_numbers() -> None:
    verl7 = load_baseline("verl-7b")
    assert verl7.hardware.gpu_model is None  # not stated by the source
    assert (verl7.hardware.nodes, verl7.hardware.gpus_per_node, verl7.hardware.world_size) == (8, 8, 64)
    assert verl7.phases["update_actor"].seconds == [73.008971]
    assert verl7.tokens.response_length_mean == 10425.773048
    assert verl7.model.hidden_size == 3584 and verl7.model.vocab_size == 152064
    assert verl7.config.settings["actor_rollout_ref.rollout.name"] == "sglang"

    verl15 = load_baseline("verl-v0.5.0-1.5b")
    assert verl15.provenance.commit == "8fdc4d3"
    assert {k: p.seconds for k, p in verl15.phases.items()} == {
        "gen": [260.922],
        "old_log_prob": [17.513],
        "update_actor": [61.125],
        "step": [363.545],
    }
    assert verl15.published_derived["gen_throughput"].value == 6992.96
    assert verl15.config.train_batch_size is None  # the source states only "batch size per DP"

    rlinf = load_baseline("rlinf-1.5b")
    assert "ref" not in rlinf.phases
    assert any("ref log-prob time is not counted" in n.lower() for n in rlinf.provenance.notes)


@pytest.mark.parametrize("path", sorted(REPO_BASELINES.glob("*.json")), ids=lambda p: p.name)
def test_every_baseline_file_is_valid_and_in_canonical_form(path: Path) -> None:
    assert validate(json.loads(path.read_text())) == []
    # Saving what was loaded reproduces the file byte for byte.
    assert dumps_record(load_record(path)) == path.read_text()


def test_resolve_by_name_stem_or_path(tmp_path: Path) -> None:
    by_name = resolve_baseline("rlinf-1.5b")
    assert by_name.name == BUILTIN_BASELINES["rlinf-1.5b"]
    assert resolve_baseline(by_name.stem) == by_name
    assert resolve_baseline(str(by_name)) == by_name
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(VALID))
    assert resolve_baseline("mine", search_dirs=[tmp_path]) == mine
    assert baseline_dirs([tmp_path])[0] == tmp_path


def test_the_package_finds_the_top_level_baselines() -> None:
    # pytest_rlbench/baselines_data links to baselines/ in a checkout; a wheel carries copies there.
    assert baseline_dirs()[0].resolve() == REPO_BASELINES.resolve()
    assert len(baseline_dirs()) == 1  # the same directory is not listed twice


def test_unknown_name_lists_the_builtin_ones() -> None:
    with pytest.raises(BaselineError) as err:
        resolve_baseline("no-such-baseline")
    assert "no-such-baseline" in str(err.value)
    assert "verl-v0.5.0-1.5b" in str(err.value)


def test_corrupt_json_names_the_file_and_position(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"format_version": 1,\n "name": }')
    with pytest.raises(BaselineError) as err:
        load_record(bad)
    assert str(bad) in str(err.value)
    assert "not valid JSON" in str(err.value) and "line 2" in str(err.value)


def test_schema_problems_are_all_reported_with_their_json_paths(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    data["hardware"]["nodes"] = "one"
    data["phases"]["gen"]["seconds"] = [1.0, -2.0]
    data["phases"]["warmup"] = {"seconds": 1.0}
    data["model"].pop("hidden_size")
    data["colour"] = "blue"
    path = tmp_path / "invalid.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError) as err:
        load_record(path)
    message = str(err.value)
    assert message.startswith(str(path))
    assert "$.hardware.nodes: expected an integer, found string 'one'" in message
    assert "$.phases.gen.seconds[1]: expected a number > 0, found -2.0" in message
    assert "$.model.hidden_size: required field missing" in message
    assert "$.colour: unknown field" in message
    assert err.value.problems and len(err.value.problems) == 4  # the unknown phase key is checked once types pass


def test_cross_field_rules() -> None:
    data = copy.deepcopy(VALID)
    data["hardware"]["world_size"] = 3
    data["phases"]["warmup"] = {"seconds": 1.0}
    data["tokens"]["response_tokens"] = 1
    data["tolerances"] = {"timing_s/warmup": 0.1}
    problems = validate(data)
    assert "$.hardware.world_size: expected nodes x gpus_per_node = 2, found 3" in problems
    assert any(p.startswith("$.phases.warmup: unknown phase key") for p in problems)
    assert "$.tokens.response_tokens: 1, but the per-sequence lengths sum to 52" in problems
    assert "$.tolerances.timing_s/warmup: 'warmup' is not a phase key" in problems


@pytest.mark.parametrize("version", [2, "1", None, True])
def test_unknown_format_version_is_rejected(version: object) -> None:
    data = dict(VALID, format_version=version)
    with pytest.raises(BaselineError) as err:
        record_from_dict(data, source="x.json")
    assert err.value.problems == [f"$.format_version: expected 1, found {_kind(version)}"]


def _kind(value: object) -> str:
    return {2: "number 2", "1": "string '1'", None: "null", True: "boolean true"}[value]  # type: ignore[index]


def test_save_load_round_trip_is_identical(tmp_path: Path) -> None:
    record = record_from_dict(VALID)
    record.phases["ref"] = PhaseRecord([0.5], tokens=TokenCounts(num_sequences=1, prompt_tokens=3, response_tokens=4))
    path = save_record(record, tmp_path / "sub" / "run.json")
    loaded = load_record(path)
    assert loaded == record
    assert record_to_dict(loaded) == record_to_dict(record)
    saved = json.loads(path.read_text())
    assert saved["phases"]["step"] == {"seconds": 4.0}  # one sample is written as a number
    assert saved["phases"]["gen"]["seconds"] == [1.5, 1.25, 1.75]
    assert "tokens" not in saved["phases"]["gen"]  # no per-phase token counts unless set
    assert '"prompt_lengths": [3, 4, 5, 6]' in path.read_text()  # number arrays stay on one line


def test_save_refuses_an_invalid_record(tmp_path: Path) -> None:
    record = record_from_dict(VALID)
    record.hardware.device = "tpu"
    target = tmp_path / "run.json"
    with pytest.raises(BaselineError) as err:
        save_record(record, target)
    assert str(target) in str(err.value) and "$.hardware.device" in str(err.value)
    assert not target.exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64 levels"),
        (b'{"name": "\xff\xfe"}', "not UTF-8 text: byte 0xff at offset 10"),
        (json.dumps(VALID).replace("1.5, 1.25", "1" + "0" * 400 + ", 1.25").encode(), "an integer of 401 digits"),
        (b'{"format_version": 1, "name": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_a_hostile_file_is_a_baseline_error_naming_the_problem(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "hostile.json"
    path.write_bytes(content)
    with pytest.raises(BaselineError) as err:
        load_record(path)
    assert str(err.value).startswith(str(path)) and problem in str(err.value)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"phases": {"gen": {"seconds": 5e-324}}}, "$.phases.gen.seconds[0]: expected a number >= 1e-09"),
        ({"phases": {"gen": {"seconds": 1e308}}}, "$.phases.gen.seconds[0]: expected a number <= 1000000.0"),
        ({"tolerances": {"timing_s": 1e300}}, "$.tolerances.timing_s: expected a number < 1, found 1e+300"),
        ({"tolerances": {"timing_s": -0.1}}, "$.tolerances.timing_s: expected a number >= 0"),
        ({"hardware": {**VALID["hardware"], "nodes": 2**63}}, "$.hardware.nodes: expected an integer of magnitude below 2**63"),
    ],
)
def test_absurd_values_that_would_disable_the_gate_are_refused(change: dict, problem: str) -> None:
    data = {**copy.deepcopy(VALID), **change}
    assert any(p.startswith(problem) for p in validate(data)), validate(data)


def test_the_plugin_turns_a_hostile_baseline_into_a_usage_error(pytester: pytest.Pytester) -> None:
    deep = pytester.path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest(f"--rl-baseline={deep}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--rl-baseline {deep}: not a usable run record" in result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
