"""A VERL-schema parquet of the synthetic math problems, each prompt exactly N tokens long.

A thin command line over ``trainer.data.synthetic.pad_prompts`` (the trainer does the same itself
with ``data.synthetic_prompt_length=N`` when data.train_files is empty):

    python benchmarks/long_prompts.py OUT.parquet --rows 512 --prompt-tokens 256
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainer.data.synthetic import write_synthetic_parquet
from trainer.models.presets import load_tokenizer


def write_padded_parquet(
    path: str | Path, rows: int, prompt_tokens: int, model: str = "r1-distill-qwen-1.5b", seed: int = 1
) -> Path:
    return write_synthetic_parquet(
        path, rows, seed, prompt_length=prompt_tokens, tokenizer=load_tokenizer(model)
    )


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
