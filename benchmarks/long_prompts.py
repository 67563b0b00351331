"""A VERL-schema parquet of the synthetic math problems, each prompt exactly N tokens long.

The synthetic prompts are about 100 tokens with the presets' character tokenizer; a benchmark of
"prompt 256 + response 1024" needs prompts of 256. Each row's user message gets a neutral preamble
(a repeated working instruction, cut to length) so that the chat-templated prompt, generation prompt
included, is exactly ``prompt_tokens`` tokens: no padding, so every sequence does the same work.

    python benchmarks/long_prompts.py OUT.parquet --rows 512 --prompt-tokens 256
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from trainer.data.loader import template_prompts
from trainer.data.schema import write_rows
from trainer.data.synthetic import generate_rows
from trainer.models.presets import load_tokenizer

PREAMBLE = "Work carefully: read the question, write each step of the arithmetic, check it, then answer. "


def padded_rows(rows: list[dict], tokenizer, prompt_tokens: int) -> list[dict]:
    """Copies of ``rows`` whose templated prompts are exactly ``prompt_tokens`` tokens long."""
    lengths = [len(ids) for ids in template_prompts(rows, tokenizer)]
    out = []
    for row, length in zip(rows, lengths, strict=True):
        missing = prompt_tokens - length
        if missing < 0:
            raise ValueError(f"a prompt already has {length} tokens, more than {prompt_tokens}")
        filler = (PREAMBLE * (missing // len(PREAMBLE) + 1))[:missing]
        new = copy.deepcopy(row)
        new["prompt"][0]["content"] = filler + new["prompt"][0]["content"]
        out.append(new)
    got = {len(ids) for ids in template_prompts(out, tokenizer)}
    if got != {prompt_tokens}:  # the character tokenizer maps one character to one token
        raise ValueError(f"padding missed: templated lengths {sorted(got)}, expected {prompt_tokens}")
    return out


def write_padded_parquet(path: str | Path, rows: int, prompt_tokens: int, model: str = "r1-distill-qwen-1.5b", seed: int = 1) -> Path:
    tokenizer = load_tokenizer(model)
    return write_rows(padded_rows(generate_rows(rows, seed), tokenizer, prompt_tokens), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--model", default="r1-distill-qwen-1.5b")
    args = parser.parse_args()
    print(write_padded_parquet(args.out, args.rows, args.prompt_tokens, args.model))


if __name__ == "__main__":
    main()
