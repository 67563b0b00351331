"""``python -m trainer --help`` lists every config key by section, from the config's own definitions (issue 30,
item 7), and the console script ``rlbench-train`` runs the same entry point.

The expected keys, sections and defaults are read here from the dataclasses (``dataclasses.fields`` walked
anew, not the module's own table), so a key added to the config shows up in ``--help`` or fails this test.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer.config import Config

ROOT = Path(__file__).parents[1]


def leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a config dataclass instance as ``{dotted.key: default}``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(leaves(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def help_text(*command: str) -> str:
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def trainer_help() -> str:
    return help_text(sys.executable, "-m", "trainer")


def sections_of(text: str) -> dict[str, list[str]]:
    """The help's config list: heading -> the keys listed under it, in order."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.split("config keys (", 1)[1].splitlines()[1:]:
        if re.fullmatch(r"[a-z_.]+:", line):
            current = sections.setdefault(line[:-1], [])
        elif line.startswith("  ") and current is not None:
            current.append(line.split()[0].split("=", 1)[0])
    return sections


def test_help_lists_every_config_key_under_its_section(trainer_help: str) -> None:
    expected: dict[str, list[str]] = {}
    for key in leaves(Config()):
        expected.setdefault(key.rpartition(".")[0], []).append(key)
    listed = sections_of(trainer_help)
    assert list(listed) == list(expected)  # every section heading, in declaration order
    for section, keys in expected.items():
        assert listed[section] == keys, f"section {section}: listed {listed[section]}, config has {keys}"


def test_help_shows_each_default_as_an_override_would_set_it(trainer_help: str) -> None:
    defaults = leaves(Config())
    lines = {
        line.split()[0].split("=", 1)[0]: line.split()[0] for line in trainer_help.splitlines() if "=" in line
    }
    assert lines["data.train_batch_size"] == f"data.train_batch_size={defaults['data.train_batch_size']}"
    assert (
        lines["actor_rollout_ref.rollout.name"]
        == f"actor_rollout_ref.rollout.name={defaults['actor_rollout_ref.rollout.name']}"
    )
    assert lines["trainer.total_training_steps"] == "trainer.total_training_steps=null"
    assert lines["actor_rollout_ref.actor.optim.betas"] == "actor_rollout_ref.actor.optim.betas=[0.9,0.999]"
    assert "data.truncation=error  [str]  (one of: error, left, right, middle)" in trainer_help
    assert "trainer.test_freq=-1  [int]  (accepted, no effect here: validation is not run)" in trainer_help


def test_help_is_quick_to_import() -> None:
    """--help reads the config alone: no torch (listing registry names would import it)."""
    code = "import sys; from trainer.__main__ import config_key_help; config_key_help(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


def test_the_console_script_is_the_same_entry_point(trainer_help: str) -> None:
    # pyproject.toml's [project.scripts] (read as text: tomllib is Python 3.11+, the project runs on 3.10)
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^rlbench-train = "trainer\.__main__:main"$', scripts, re.M), scripts
    assert "rlbench-train" in trainer_help
    installed = shutil.which("rlbench-train", path=str(Path(sys.executable).parent))
    if installed is None:
        pytest.skip("rlbench-train is not installed in this environment (pip install -e .)")
    assert (
        help_text(installed).split("\n", 1)[1] == trainer_help.split("\n", 1)[1]
    )  # the usage line names the program
