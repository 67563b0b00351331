"""VERL's RL data set schema: one row per prompt, as VERL's "Prepare Data for Post-Training" docs
(verl.readthedocs.io, preparation/prepare_data) and examples/data_preprocess/gsm8k.py write it.

    data_source   string                                   which data set (picks the reward function)
    prompt        list<struct{role: string, content: string}>   the chat messages
    ability       string                                   task category ("math", ...)
    reward_model  struct{style: string, ground_truth: string}   how to score and the right answer
    extra_info    struct{split: string, index: int64, answer: string, question: string}

That is the reference schema (``RL_SCHEMA``): what this package writes and what a strict validation
checks. VERL's other preprocessors write other shapes: math_dataset.py's extra_info is {split, index},
the tool and agent scripts add tools_kwargs, interaction_kwargs, need_tools_kwargs and agent_name,
hellaswag.py's ground truth is an integer, the Search-R1 script's a {target: [answers]} struct, and
columns of the source data set ride along (MATH's level and type). The trainer reads only
``TRAINER_SCHEMA``: data_source, the prompt's roles and contents, and reward_model.ground_truth; a
lenient validation (what loading uses) requires those and accepts any extra_info and any other
columns, except ``MULTIMODAL_COLUMNS``: the trainer is text-only.

The validator (validate.py) also accepts the variants a reader may meet in other people's files
(large_string, large_list, any integer index).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
PROMPT_TYPE = pa.list_(MESSAGE_TYPE)
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
EXTRA_INFO_TYPE = pa.struct(
    [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
)

RL_SCHEMA: pa.Schema = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", PROMPT_TYPE),
        ("ability", pa.string()),
        ("reward_model", REWARD_MODEL_TYPE),
        ("extra_info", EXTRA_INFO_TYPE),
    ]
)

COLUMNS: tuple[str, ...] = tuple(RL_SCHEMA.names)

# Chat roles the Hugging Face chat templates know; anything else is a typo or a foreign format.
VALID_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})

# Every leaf of the schema, as the validator names it ("prompt[i].role" stands for each message).
ALL_FIELDS: frozenset[str] = frozenset(
    {
        "data_source",
        "prompt",
        "prompt[].role",
        "prompt[].content",
        "ability",
        "reward_model",
        "reward_model.style",
        "reward_model.ground_truth",
        "extra_info",
        "extra_info.split",
        "extra_info.index",
        "extra_info.answer",
        "extra_info.question",
    }
)

# What the trainer reads from a row (trainer/data/loader.py): a lenient validation (strict=False)
# requires these and checks nothing else, so every text RL file VERL's preprocessors write loads.
# The ground truth may also be an integer or a list of answers there (validate.py says which shapes).
TRAINER_SCHEMA: pa.Schema = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", PROMPT_TYPE),
        ("reward_model", pa.struct([("ground_truth", pa.string())])),
    ]
)

TRAINER_FIELDS: frozenset[str] = frozenset(
    {
        "data_source",
        "prompt",
        "prompt[].role",
        "prompt[].content",
        "reward_model",
        "reward_model.ground_truth",
    }
)


# VERL's RLHFDataset reads images and videos from these columns (data.image_key, data.video_key);
# a file with any in them is multi-modal, which this text-only trainer refuses.
MULTIMODAL_COLUMNS: tuple[str, ...] = ("images", "videos")


def is_string_type(t: pa.DataType) -> bool:
    """string, large_string or string_view: the string types a parquet reader may hand back."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def is_list_type(t: pa.DataType) -> bool:
    """Any arrow list type (plain, large, fixed-size, view) with a ``value_type``."""
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def rows_to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Build a table with exactly ``RL_SCHEMA`` from row dicts (raises pyarrow's error on bad types)."""
    return pa.Table.from_pylist([dict(r) for r in rows], schema=RL_SCHEMA)


def write_rows(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows as a VERL-schema parquet file (parent folders created) and return its path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows_to_table(rows), out)
    return out
