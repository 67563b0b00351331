"""The engine registry: one list of names, engines declared by installed packages, and the shared decode loop."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainer.rollout import (
    ENGINES,
    ENTRY_POINT_GROUP,
    NonFiniteLogitsError,
    RowsRequest,
    SamplingParams,
    StaticRolloutEngine,
    engine_class,
    engine_names,
    make_engine,
    register_engine,
)
from trainer.rollout.decode_loop import decode_until_done

REPO = Path(__file__).resolve().parents[1]


def declare(tmp_path: Path, entry: str) -> Path:
    """An installed-looking distribution under tmp_path whose entry point ``toy`` is ``entry``, and
    the module ``toy_engines`` it may point at."""
    (tmp_path / "toy_engines.py").write_text(
        textwrap.dedent(
            """
            from trainer.rollout import StaticRolloutEngine

            class ToyEngine(StaticRolloutEngine):
                name = "toy"

            NOT_AN_ENGINE = 3
            """
        )
    )
    info = tmp_path / "toy_engines-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-engines\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntoy = {entry}\n")
    return tmp_path


@pytest.fixture
def forget_toy():
    yield
    ENGINES.unregister("toy")
    sys.modules.pop("toy_engines", None)


def test_the_bundled_names_come_first_and_unknown_names_list_them():
    assert engine_names()[:3] == ("hf", "static", "fast")
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'; valid names: hf, static, fast, vllm"):
        engine_class("sglang")


def test_register_engine_takes_engines_only(forget_toy):
    with pytest.raises(TypeError, match="'toy': expected a RolloutEngine subclass, got 3"):
        register_engine("toy", 3)  # type: ignore[arg-type]
    register_engine("toy", StaticRolloutEngine)
    assert engine_names()[-1] == "toy" and engine_class("toy") is StaticRolloutEngine


def test_an_entry_point_engine_is_named_and_built(tmp_path, monkeypatch, forget_toy, tok):
    from trainer.models.presets import build_model

    monkeypatch.syspath_prepend(str(declare(tmp_path, "toy_engines:ToyEngine")))
    assert "toy" in engine_names() and "toy_engines" not in sys.modules, "declared, not imported until asked for"
    engine = make_engine("toy", build_model("tiny", seed=0), tok)
    assert type(engine).__name__ == "ToyEngine" and ENGINES["toy"] is type(engine)
    batch = engine.generate([[5, 6, 7]], [0], [], 2, 4, SamplingParams(do_sample=False), 0)
    assert batch.response_ids.shape[0] == 2


def test_an_entry_point_that_is_no_engine_is_named(tmp_path, monkeypatch, forget_toy):
    monkeypatch.syspath_prepend(str(declare(tmp_path, "toy_engines:NOT_AN_ENGINE")))
    with pytest.raises(TypeError, match="'toy_engines:NOT_AN_ENGINE' .* expected a RolloutEngine subclass, got 3"):
        engine_class("toy")


def test_a_declared_engine_reaches_a_fresh_process(tmp_path):
    """What a Ray worker is: a process where nobody called register_engine."""
    path = os.pathsep.join([str(declare(tmp_path, "toy_engines:ToyEngine")), str(REPO)])
    code = "from trainer.rollout import engine_class, engine_names; print(engine_names(), engine_class('toy').__name__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "('hf', 'static', 'fast', 'vllm', 'toy') ToyEngine"


# ----------------------------------------------------------------------------- the shared decode loop
def request(max_new: int, row_offset: int = 0) -> RowsRequest:
    ids = torch.zeros(3, 2, dtype=torch.long)
    return RowsRequest(ids, torch.ones_like(ids), torch.arange(3), max_new, SamplingParams(), 0, None, 1, row_offset, 2)


def test_the_loop_stops_at_the_first_check_after_every_row_ended():
    finished, first_bad, calls = torch.zeros(3, dtype=torch.bool), torch.full((3,), -1), []

    def step(i: int) -> None:
        calls.append(i)
        finished[i - 1] = True  # row i - 1 ends at token i

    assert decode_until_done(step, first_bad, finished, request(max_new=100), 4, "toy") == 4
    assert calls == [1, 2, 3]
    assert decode_until_done(lambda i: None, first_bad, torch.zeros(3, dtype=torch.bool), request(7), 4, "toy") == 7


def test_the_loop_names_the_first_bad_step_and_its_whole_batch_rows():
    finished, first_bad = torch.zeros(3, dtype=torch.bool), torch.full((3,), -1)

    def step(i: int) -> None:
        if i == 2:
            first_bad[1] = first_bad[2] = 2
        if i == 3:
            first_bad[0] = 3

    with pytest.raises(NonFiniteLogitsError, match=r"decode step 2 in batch rows \[11, 12\] \(prompts \[5, 6\], micro-batch 1\)"):
        decode_until_done(step, first_bad, finished, request(max_new=4, row_offset=10), 8, "toy")
