"""Every text RL file VERL's own preprocessors write loads; multi-modal ones are refused, saying so.

Each shape is written as its script in VERL's examples/data_preprocess/ writes it (volcengine/verl at
``VERL_COMMIT``): the script's process function, copied here, applied to a few made-up rows of its
source data set. Like ``datasets.Dataset.map`` it keeps the source columns the function does not pop
(MATH's level and type, all of hellaswag's), and pyarrow infers the types as ``datasets`` does; the
Search-R1 script uses pandas, and so does its shape here. Where Hugging Face ``datasets`` is installed,
``test_the_shapes_are_the_ones_datasets_writes`` runs the same functions through
``Dataset.map(...).to_parquet()`` and compares the files' schemas.

The text shapes must load through the trainer's loader (``load_train_dataset``, what the session runs)
with the reference-schema differences reported, not refused; the multi-modal ones (geo3k) must be
refused with a message naming the file and the images column.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.config import DataConfig
from trainer.data.loader import load_prompts
from trainer.data.problems import DatasetError
from trainer.data.source import load_train_dataset
from trainer.data.validate import reference_differences, validate_parquet
from trainer.models.presets import load_tokenizer

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"  # volcengine/verl, 2026-01-29


# ----------------------------------------------------------------------------- made-up source rows
def gsm8k_source(n: int) -> list[dict[str, Any]]:
    # openai/gsm8k "main": question, answer (the worked solution ending "#### <number>")
    return [
        {
            "question": f"Tom has {k + 3} apples and buys {k + 1}000 more. How many apples does he have?",
            "answer": f"{k + 3} + {k + 1}000 = <<{k + 3}+{k + 1}000>>{k + 1}00{k + 3}\n#### {k + 1},00{k + 3}",
        }
        for k in range(n)
    ]


def math_source(n: int) -> list[dict[str, Any]]:
    # DigitalLearningGmbH/MATH-lighteval: problem, level, type, solution
    return [
        {
            "problem": f"What is $\\frac{{{k + 1}}}{{2}} + \\frac{{1}}{{2}}$?",
            "level": f"Level {k % 5 + 1}",
            "type": "Prealgebra",
            "solution": f"Add the numerators: $\\frac{{{k + 2}}}{{2}} = \\boxed{{\\frac{{{k + 2}}}{{2}}}}$.",
        }
        for k in range(n)
    ]


def hh_rlhf_source(n: int) -> list[dict[str, Any]]:
    # Dahoas/full-hh-rlhf: prompt, response, chosen, rejected
    return [
        {
            "prompt": f"\n\nHuman: How do I water a cactus, question {k}?\n\nAssistant:",
            "response": " Sparingly: once every two weeks.",
            "chosen": " Sparingly: once every two weeks.",
            "rejected": " Every day, a lot.",
        }
        for k in range(n)
    ]


def hellaswag_source(n: int) -> list[dict[str, Any]]:
    # Rowan/hellaswag: ind, activity_label, ctx_a, ctx_b, ctx, endings, source_id, split, split_type, label
    return [
        {
            "ind": 24 + k,
            "activity_label": "Roof shingle removal",
            "ctx_a": "A man is sitting on a roof.",
            "ctx_b": "he",
            "ctx": "A man is sitting on a roof. he",
            "endings": [
                "is using wrap to wrap a pair of skis.",
                "is ripping level tiles off.",
                "is holding a rubik's cube.",
                "starts pulling up roofing on a roof.",
            ],
            "source_id": f"activitynet~v_-JhWjGDPHMY{k}",
            "split": "train",
            "split_type": "indomain",
            "label": str(k % 4),
        }
        for k in range(n)
    ]


def dapo_source(n: int, data_source: str = "math_dapo") -> list[dict[str, Any]]:
    # BytedTsinghua-SIA/DAPO-Math-17k (and AIME-2024, the same columns): already VERL-shaped, with a
    # uuid string as extra_info.index and the message's keys in the order content, role.
    return [
        {
            "data_source": data_source,
            "prompt": [
                {
                    "content": f"Solve the following math problem step by step. Find {k} + 30.\n\n"
                    'Remember to put your answer on its own line after "Answer:".',
                    "role": "user",
                }
            ],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(k + 30), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"9a9b6eb4-a1cb-49d1-8c1e-62eaf2f7407{k}"},
        }
        for k in range(n)
    ]


def search_r1_source(n: int) -> list[dict[str, Any]]:
    # PeterJinGo/nq_hotpotqa_train: Search-R1's processed rows; ground truth {target: golden answers}
    rows = []
    for k in range(n):
        answers = [f"Paris {k}", f"the city of Paris {k}"]
        rows.append(
            {
                "id": f"train_{k}",
                "question": f"what is the capital of france {k}?",
                "golden_answers": answers,
                "data_source": "nq",
                "prompt": [{"content": f"Answer the question: capital of france {k}?", "role": "user"}],
                "ability": "fact-reasoning",
                "reward_model": {"ground_truth": {"target": answers}, "style": "rule"},
                "extra_info": {"index": k, "split": "train"},
                "metadata": None,
            }
        )
    return rows


def geo3k_source(n: int) -> list[dict[str, Any]]:
    # hiyouga/geometry3k: images (a list of images: bytes and path), problem, answer
    return [
        {
            "images": [{"bytes": b"\x89PNG\r\n\x1a\n" + bytes([k]) * 16, "path": f"diagram_{k}.png"}],
            "problem": f"<image>Find x so that the angle is {k + 30} degrees.",
            "answer": str(k + 30),
        }
        for k in range(n)
    ]


# ----------------------------------------------------------------------------- the scripts' functions
def extract_hash_answer(solution_str: str) -> str:  # gsm8k.py's extract_solution
    solution = re.search("#### (\\-?[0-9\\.\\,]+)", solution_str)
    assert solution is not None
    return solution.group(0).split("#### ")[1].replace(",", "")


def last_boxed(text: str) -> str:  # what math_dataset.py's remove_boxed(last_boxed_only_string(..)) gives
    start = text.rindex("\\boxed{") + len("\\boxed{")
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    raise AssertionError(text)


GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
TOOL_INSTRUCTION = "Let's think step by step and output the final answer after `####`."
TOOL_SYSTEM = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    "You should use the `calc_gsm8k_reward` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)


def gsm8k(example: dict, idx: int, split: str) -> dict:  # gsm8k.py
    question_raw = example.pop("question")
    question = question_raw + " " + GSM8K_INSTRUCTION
    answer_raw = example.pop("answer")
    solution = extract_hash_answer(answer_raw)
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": idx, "answer": answer_raw, "question": question_raw},
    }


def math_dataset(example: dict, idx: int, split: str) -> dict:  # math_dataset.py
    question = example.pop("problem")
    question = question + " " + "Let's think step by step and output the final answer within \\boxed{}."
    answer = example.pop("solution")
    return {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": last_boxed(answer)},
        "extra_info": {"split": split, "index": idx},
    }


def full_hh_rlhf(example: dict, idx: int, split: str) -> dict:  # full_hh_rlhf.py --split rl
    prompt = example.pop("prompt")
    response = example.pop("response")
    return {
        "data_source": "Dahoas/full-hh-rlhf",
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "alignment",
        "reward_model": {"style": "model", "ground_truth": response},
        "extra_info": {"split": split, "index": idx},
    }


def _hellaswag_text(text: str) -> str:  # hellaswag.py's preprocess
    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag(doc: dict, idx: int, split: str) -> dict:  # hellaswag.py (pops nothing)
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    query = _hellaswag_text(doc["activity_label"] + ": " + ctx)
    return {
        "data_source": "Rowan/hellaswag",
        "prompt": [{"role": "user", "content": query}],
        "ability": "nlp",
        "reward_model": {
            "style": "model",
            "eval": "multiple_choice",
            "ground_truth": int(doc["label"]),
            "choices": [_hellaswag_text(ending) for ending in doc["endings"]],
        },
        "extra_info": {"split": split, "index": idx},
    }


def gsm8k_multiturn_w_tool(example: dict, idx: int, split: str, agent: bool = False) -> dict:
    # gsm8k_multiturn_w_tool.py; with agent, gsm8k_tool_agent_loop.py (the same and an agent_name)
    question_raw = example.pop("question")
    question = question_raw + " " + TOOL_INSTRUCTION
    answer_raw = example.pop("answer")
    solution = extract_hash_answer(answer_raw)
    data = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {
            "split": split,
            "index": idx,
            "answer": answer_raw,
            "question": question_raw,
            "need_tools_kwargs": True,
            "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": solution}}},
            "interaction_kwargs": {"query": question, "ground_truth": solution},
        },
    }
    return {"data_source": data.pop("data_source"), "agent_name": "tool_agent", **data} if agent else data


def gsm8k_multiturn_w_interaction(example: dict, idx: int, split: str) -> dict:  # ..._w_interaction.py
    question_raw = example.pop("question")
    question = question_raw + " " + TOOL_INSTRUCTION
    answer_raw = example.pop("answer")
    solution = extract_hash_answer(answer_raw)
    return {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "system",
                "content": "You are a math expert. You are given a question and you need to solve it step by "
                "step. You should rethinking carefully if user point out your answer is wrong. Put your "
                "final answer in the format of `#### <answer>`.",
            },
            {"role": "user", "content": question},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {
            "split": split,
            "index": idx,
            "answer": answer_raw,
            "question": question_raw,
            "interaction_kwargs": {"name": "gsm8k", "query": question, "ground_truth": solution},
        },
    }


def dapo_multiturn_w_tool(example: dict, idx: int, split: str) -> dict:
    # dapo_multiturn_w_tool.py and aime2024_multiturn_w_tool.py (the same function)
    orig_extra_info = example.pop("extra_info")
    extra_info = orig_extra_info.copy()
    extra_info["need_tools_kwargs"] = True
    extra_info["tools_kwargs"] = {
        "code_interpreter": {"create_kwargs": {"ground_truth": example["reward_model"]["ground_truth"]}}
    }
    example["extra_info"] = extra_info
    return example


def geo3k(example: dict, idx: int, split: str, tool: bool = False) -> dict:
    # geo3k.py; with tool, geo3k_multiturn_w_tool.py
    problem = example.pop("problem")
    prompt = problem + " " + "You FIRST think about the reasoning process ... put in \\boxed{}."
    answer = example.pop("answer")
    images = example.pop("images")
    messages = [{"role": "user", "content": prompt}]
    extra_info: dict[str, Any] = {"split": split, "index": idx, "answer": answer, "question": problem}
    if tool:
        messages.insert(0, {"role": "system", "content": "You are a math expert. Use `calc_geo3k_reward`."})
        extra_info["need_tools_kwargs"] = True
        extra_info["tools_kwargs"] = {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": answer}}}
    return {
        "data_source": "hiyouga/geometry3k",
        "prompt": messages,
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": extra_info,
    }


SEARCH_SYSTEM = "You are a helpful and harmless assistant."
SEARCH_USER_PREFIX = "Answer the given question. You can search with <search> query </search>. Question: "


def search_r1_row(row: pd.Series, current_split_name: str, row_index: int) -> pd.Series:
    # preprocess_search_r1_dataset.py's process_single_row, on a row of pandas.read_parquet
    question = row.get("question", "")
    prompt = [
        {"role": "system", "content": SEARCH_SYSTEM},
        {"role": "user", "content": SEARCH_USER_PREFIX.rstrip("\n") + question},
    ]
    reward_model_data = row.get("reward_model")
    if isinstance(reward_model_data, dict) and "ground_truth" in reward_model_data:
        ground_truth = reward_model_data.get("ground_truth")
    else:
        ground_truth = row.get("golden_answers", [])
    data_source_tagged = "searchR1_" + str(row.get("data_source", ""))
    tools_kwargs = {
        "search": {
            "create_kwargs": {
                "ground_truth": ground_truth,
                "question": question,
                "data_source": data_source_tagged,
            }
        }
    }
    extra_info = {
        "index": row_index,
        "need_tools_kwargs": True,
        "question": question,
        "split": current_split_name,
        "tools_kwargs": tools_kwargs,
    }
    return pd.Series(
        {
            "data_source": data_source_tagged,
            "prompt": prompt,
            "ability": row.get("ability"),
            "reward_model": reward_model_data,
            "extra_info": extra_info,
            "metadata": row.get("metadata"),
        }
    )


# ----------------------------------------------------------------------------- writing the shapes
@dataclass(frozen=True)
class Shape:
    """One preprocessor's output: its script, its source rows, its process function (datasets.map
    style: ``fn(example, idx, split)``), the ground truths the trainer should read, and lines of
    ``reference_differences`` it must report (none for gsm8k.py's own shape)."""

    script: str
    source: Callable[[int], list[dict[str, Any]]]
    process: Callable[..., dict]
    truths: Callable[[list[dict[str, Any]]], list[str]]
    differences: tuple[str, ...]
    multimodal: bool = False


def _gsm8k_truths(rows: list[dict]) -> list[str]:
    return [extract_hash_answer(r["answer"]) for r in rows]


TEXT_SHAPES: dict[str, Shape] = {
    "gsm8k": Shape("gsm8k.py", gsm8k_source, gsm8k, _gsm8k_truths, ()),
    "math": Shape(
        "math_dataset.py",
        math_source,
        math_dataset,
        lambda rows: [last_boxed(r["solution"]) for r in rows],
        (
            "extra_info.answer: missing (the reference has a string)",
            "extra_info.question: missing (the reference has a string)",
            "level: a column not in the reference (string)",
            "type: a column not in the reference (string)",
        ),
    ),
    "full_hh_rlhf": Shape(
        "full_hh_rlhf.py",
        hh_rlhf_source,
        full_hh_rlhf,
        lambda rows: [r["response"] for r in rows],
        (
            "extra_info.answer: missing (the reference has a string)",
            "chosen: a column not in the reference (string)",
        ),
    ),
    "hellaswag": Shape(
        "hellaswag.py",
        hellaswag_source,
        hellaswag,
        lambda rows: [r["label"] for r in rows],
        (
            "reward_model.ground_truth: int64, the reference has string",
            "reward_model.choices: not in the reference (list<string>)",
            "endings: a column not in the reference (list<string>)",
        ),
    ),
    "gsm8k_multiturn_w_tool": Shape(
        "gsm8k_multiturn_w_tool.py",
        gsm8k_source,
        gsm8k_multiturn_w_tool,
        _gsm8k_truths,
        ("extra_info.need_tools_kwargs: not in the reference (bool)",),
    ),
    "gsm8k_multiturn_w_interaction": Shape(
        "gsm8k_multiturn_w_interaction.py",
        gsm8k_source,
        gsm8k_multiturn_w_interaction,
        _gsm8k_truths,
        ("extra_info.interaction_kwargs: not in the reference (struct{name, query, ground_truth})",),
    ),
    "gsm8k_tool_agent_loop": Shape(
        "gsm8k_tool_agent_loop.py",
        gsm8k_source,
        partial(gsm8k_multiturn_w_tool, agent=True),
        _gsm8k_truths,
        ("agent_name: a column not in the reference (string)",),
    ),
    "dapo_multiturn_w_tool": Shape(
        "dapo_multiturn_w_tool.py",
        dapo_source,
        dapo_multiturn_w_tool,
        lambda rows: [r["reward_model"]["ground_truth"] for r in rows],
        (
            "extra_info.index: string, the reference has int64",
            "extra_info.split: missing (the reference has a string)",
            "extra_info.tools_kwargs: not in the reference (struct{code_interpreter})",
        ),
    ),
    "aime2024_multiturn_w_tool": Shape(
        "aime2024_multiturn_w_tool.py",
        partial(dapo_source, data_source="aime2024"),
        dapo_multiturn_w_tool,
        lambda rows: [r["reward_model"]["ground_truth"] for r in rows],
        ("extra_info.index: string, the reference has int64",),
    ),
    "search_r1": Shape(
        "preprocess_search_r1_dataset.py",
        search_r1_source,
        search_r1_row,  # through pandas: see write_shape
        lambda rows: [r["golden_answers"][0] for r in rows],
        (
            "reward_model.ground_truth: struct{target}, the reference has string",
            "extra_info.tools_kwargs: not in the reference (struct{search})",
            "metadata: a column not in the reference (null)",
        ),
    ),
}
STRICTLY_VALID = ("gsm8k", "gsm8k_multiturn_w_tool", "gsm8k_multiturn_w_interaction", "gsm8k_tool_agent_loop")
MULTIMODAL_SHAPES: dict[str, Shape] = {
    "geo3k": Shape("geo3k.py", geo3k_source, geo3k, lambda rows: [r["answer"] for r in rows], ()),
    "geo3k_multiturn_w_tool": Shape(
        "geo3k_multiturn_w_tool.py",
        geo3k_source,
        partial(geo3k, tool=True),
        lambda rows: [r["answer"] for r in rows],
        (),
    ),
}


def mapped_rows(shape: Shape, source: list[dict[str, Any]], split: str = "train") -> list[dict[str, Any]]:
    """What ``Dataset.map(make_map_fn(split), with_indices=True)`` gives: the source columns the
    function did not pop, in place (a column it returns anew keeps its place), then its new columns."""
    out = []
    for idx, raw in enumerate(source):
        example = {k: (list(v) if isinstance(v, list) else v) for k, v in raw.items()}
        new = shape.process(example, idx, split=split)
        kept = {k: new.get(k, example.get(k)) for k in raw if k in new or k in example}
        out.append({**kept, **{k: v for k, v in new.items() if k not in kept}})
    return out


def write_shape(name: str, directory: Path, n: int = 4) -> tuple[Path, list[dict[str, Any]]]:
    """The parquet file the shape's script writes for ``n`` made-up source rows, and those rows."""
    shape = TEXT_SHAPES.get(name) or MULTIMODAL_SHAPES[name]
    source = shape.source(n)
    path = directory / f"{name}.parquet"
    if shape.process is search_r1_row:  # pandas all the way, as the script does
        raw = directory / f"{name}.raw.parquet"
        pd.DataFrame(source).to_parquet(raw)
        df_raw = pd.read_parquet(raw)
        df_raw.apply(lambda row: search_r1_row(row, "train", row.name), axis=1).to_parquet(path, index=False)
    else:
        pq.write_table(pa.Table.from_pylist(mapped_rows(shape, source)), path)
    return path, source


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


def data_config(path: Path, **overrides: Any) -> DataConfig:
    return DataConfig(train_files=[str(path)], max_prompt_length=1024, **overrides)


# ----------------------------------------------------------------------------- the text shapes load
@pytest.mark.parametrize("name", sorted(TEXT_SHAPES))
def test_each_text_shape_loads_as_a_run_loads_it(name: str, tokenizer, tmp_path: Path) -> None:
    shape = TEXT_SHAPES[name]
    path, source = write_shape(name, tmp_path)
    assert validate_parquet(path, strict=False) == []
    dataset = load_train_dataset(data_config(path), tokenizer, tmp_path)
    assert len(dataset) == len(source) == dataset.num_rows
    assert [p.ground_truth for p in dataset.prompts] == [str(t) for t in shape.truths(source)]
    table = pq.read_table(path)
    rows = table.to_pylist()
    assert [p.data_source for p in dataset.prompts] == [r["data_source"] for r in rows]
    assert [list(p.messages) for p in dataset.prompts] == [
        [{"role": m["role"], "content": m["content"]} for m in r["prompt"]] for r in rows
    ]
    assert all(p.input_ids for p in dataset.prompts)


@pytest.mark.parametrize("name", sorted(TEXT_SHAPES))
def test_each_text_shape_differs_from_the_reference_in_what_its_script_writes(
    name: str, tmp_path: Path
) -> None:
    path, _ = write_shape(name, tmp_path)
    differences = reference_differences(path)
    assert set(TEXT_SHAPES[name].differences) <= set(differences), differences
    assert bool(differences) == (name != "gsm8k")
    # A strict validation (the reference's fields, other fields ignored) refuses those that lack or
    # retype one: a check of the reference, not what loading uses.
    assert (validate_parquet(path, strict=True) == []) == (name in STRICTLY_VALID)


def test_the_issue_s_math_file_loads_and_strictly_still_says_what_differs(tokenizer, tmp_path: Path) -> None:
    path, _ = write_shape("math", tmp_path)
    strict = [str(p) for p in validate_parquet(path, strict=True)]
    assert "every row, extra_info.answer: expected string, found no such field" in strict
    assert "every row, extra_info.question: expected string, found no such field" in strict
    with pytest.raises(DatasetError, match="extra_info.answer"):
        load_prompts(path, tokenizer, 1024, strict=True)
    assert len(load_prompts(path, tokenizer, 1024)) == 4  # the default: what the trainer reads


def test_the_indexes_are_extra_info_s_when_integers_else_row_positions(tokenizer, tmp_path: Path) -> None:
    math_path, _ = write_shape("math", tmp_path, n=3)
    dapo_path, _ = write_shape("dapo_multiturn_w_tool", tmp_path, n=3)
    assert [p.index for p in load_prompts(math_path, tokenizer, 1024)] == [0, 1, 2]
    assert [p.index for p in load_prompts(dapo_path, tokenizer, 1024)] == [0, 1, 2]  # uuid strings
    assert len({p.uid for p in load_prompts(dapo_path, tokenizer, 1024)}) == 3


def test_several_accepted_answers_are_scored_against_the_first_and_said_so(
    tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, source = write_shape("search_r1", tmp_path, n=2)
    with caplog.at_level("WARNING", logger="trainer.data.loader"):
        dataset = load_prompts(path, tokenizer, 1024)
    assert [p.ground_truth for p in dataset] == ["Paris 0", "Paris 1"]
    assert "2 of 2 prompts have several accepted answers" in caplog.text


def test_the_written_shapes_have_the_types_the_scripts_give(tmp_path: Path) -> None:
    def schema(name: str) -> pa.Schema:
        return pq.read_schema(write_shape(name, tmp_path)[0])

    assert schema("math").names == [
        "level",
        "type",
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    ]
    assert schema("math").field("extra_info").type == pa.struct(
        [("split", pa.string()), ("index", pa.int64())]
    )
    assert schema("hellaswag").field("reward_model").type.field("ground_truth").type == pa.int64()
    assert schema("dapo_multiturn_w_tool").field("extra_info").type.field("index").type == pa.string()
    assert schema("gsm8k_tool_agent_loop").names[:2] == ["data_source", "agent_name"]
    search = schema("search_r1")
    assert search.field("reward_model").type.field("ground_truth").type == pa.struct(
        [("target", pa.list_(pa.string()))]
    )
    assert search.field("metadata").type == pa.null()
    images = schema("geo3k").field("images").type
    assert images == pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


# ----------------------------------------------------------------------------- multi-modal is refused
@pytest.mark.parametrize("name", sorted(MULTIMODAL_SHAPES))
def test_each_multimodal_shape_is_refused_naming_the_file_and_the_column(
    name: str, tokenizer, tmp_path: Path
) -> None:
    path, source = write_shape(name, tmp_path, n=3)
    for strict in (False, True):
        problems = validate_parquet(path, strict=strict)
        assert [(p.row, p.field, p.column) for p in problems] == [(None, "images", True)]
    with pytest.raises(DatasetError) as info:
        load_train_dataset(data_config(path), tokenizer, tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}: 1 problem")
    assert "column images: expected no images or videos (multi-modal data is not supported" in message
    assert "found image data in 3 of 3 rows" in message


def test_a_supervised_fine_tuning_file_is_refused_saying_what_it_is(tokenizer, tmp_path: Path) -> None:
    # gsm8k_multiturn_sft.py and multiturn.py write a messages column, not an RL prompt
    path = tmp_path / "sft.parquet"
    rows = [{"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(
        DatasetError, match="prompt: expected a column of type .* messages column: a supervised"
    ):
        load_train_dataset(data_config(path), tokenizer, tmp_path)


# ----------------------------------------------------------------------------- the same files as datasets writes them
def test_the_shapes_are_the_ones_datasets_writes(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    for name, shape in {**TEXT_SHAPES}.items():
        if name == "search_r1":  # pandas, not datasets: write_shape runs the script's own steps
            continue
        ours, source = write_shape(name, tmp_path)
        theirs = tmp_path / f"{name}.datasets.parquet"
        mapped = datasets.Dataset.from_list(source).map(
            partial(shape.process, split="train"), with_indices=True
        )
        mapped.to_parquet(str(theirs))
        assert pq.read_schema(ours).remove_metadata() == pq.read_schema(theirs).remove_metadata(), name
        assert pq.read_table(ours).to_pylist() == pq.read_table(theirs).to_pylist(), name


# ----------------------------------------------------------------------------- the session and the suites
@pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py
def test_a_session_loads_a_math_file_and_ends_at_start_up_on_a_geo3k_one(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    math, _ = write_shape("math", tmp_path, n=16)
    pytester.makepyfile(
        """
        import pathlib
        def test_data(rl_dataset):
            pathlib.Path("ran").write_text("yes")
            assert len(rl_dataset) == 16
            assert rl_dataset.prompts[0].data_source == "DigitalLearningGmbH/MATH-lighteval"
            assert rl_dataset.prompts[0].ground_truth == "\\\\frac{2}{2}"
        """
    )
    limits = "--rl-config=data.max_prompt_length=1024"
    pytester.runpytest(f"--rl-dataset={math}", limits).assert_outcomes(passed=1)

    (pytester.path / "ran").unlink()
    geo, _ = write_shape("geo3k", tmp_path, n=16)
    result = pytester.runpytest(f"--rl-dataset={geo}", limits)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stderr.str()  # the session's one "ERROR: pytest-rlbench: ..." line
    assert str(geo) in out and "column images: expected no images or videos" in out, out
    assert "multi-modal data is not supported" in out
    assert not (pytester.path / "ran").exists()


@pytest.mark.usefixtures("plugin_deps_loaded")
def test_the_schema_suite_passes_a_math_file_and_warns_how_it_differs(
    pytester: pytest.Pytester, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    math, _ = write_shape("math", tmp_path, n=16)
    suite = str(request.config.rootpath / "suites" / "test_schema.py")
    options = [f"--rl-dataset={math}", "--rl-config=data.max_prompt_length=1024", "-p", "no:randomly"]
    result = pytester.runpytest(suite, *options, "-k", "dataset")
    result.assert_outcomes(passed=4)  # pytest's own warnings (assert rewriting) depend on the run's order
    out = result.stdout.str()
    assert out.count("ReferenceSchemaWarning: ") == 1, out
    assert "extra_info.answer: missing (the reference has a string)" in out
    # the strict check, on request
    strict = pytester.runpytest(
        suite, *options, "-k", "differences", "-W", "error::trainer.data.validate.ReferenceSchemaWarning"
    )
    strict.assert_outcomes(failed=1)
