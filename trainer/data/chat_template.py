"""Prompt messages to token ids through the tokenizer's chat template, as VERL's RLHFDataset does
(verl/utils/dataset/rl_dataset.py: ``apply_chat_template(..., add_generation_prompt=True)``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainer.data.problems import DatasetError, Problem, describe_value

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def prompt_messages(prompt: Any) -> list[dict[str, str]]:
    """A row's prompt as chat messages: plain dicts with only role and content (parquet and pandas
    hand back other shapes)."""
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def template_prompts(
    rows: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: str = "<rows>"
) -> list[list[int]]:
    """Token ids of each row's chat-templated prompt (generation prompt added, no extra special
    tokens: the template already has them). Rows the template rejects are reported together."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__}: expected a chat template (tokenizer.chat_template), found none"
        )
    texts: list[str] = []
    problems: list[Problem] = []
    for i, row in enumerate(rows):
        try:
            text = tokenizer.apply_chat_template(
                prompt_messages(row["prompt"]), add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja raises its own types, e.g. for roles a template refuses
            problems.append(
                Problem(i, "prompt", "messages the chat template accepts", describe_value(str(exc)))
            )
            text = ""
        texts.append(text)
    if problems:
        raise DatasetError(source, problems)
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
