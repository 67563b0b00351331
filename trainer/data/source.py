"""Where the training prompts come from: data.train_files, or the synthetic math set when empty."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from trainer.config import DataConfig
from trainer.data.loader import PromptDataset, load_prompts
from trainer.data.synthetic import write_synthetic_parquet


def write_synthetic_set(data: DataConfig, path: str | Path, tokenizer: PreTrainedTokenizerBase | None) -> Path:
    """Write the synthetic set that ``data.synthetic_*`` describe at ``path`` (through a temporary
    file, so a half-written file never has the final name); the tokenizer pads the prompts to
    data.synthetic_prompt_length templated tokens when that is > 0."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    write_synthetic_parquet(
        tmp,
        data.synthetic_size,
        data.seed,
        difficulty=data.synthetic_difficulty,
        prompt_length=data.synthetic_prompt_length,
        tokenizer=tokenizer,
    )
    tmp.replace(path)
    return path


def synthetic_path(data: DataConfig, workdir: str | Path, tokenizer: PreTrainedTokenizerBase | None = None) -> Path:
    """Write (once) the synthetic set that ``data`` describes into ``workdir``; return its path."""
    padded = f"_p{data.synthetic_prompt_length}" if data.synthetic_prompt_length > 0 else ""
    name = f"synthetic_math_{data.synthetic_difficulty}_n{data.synthetic_size}_seed{data.seed}{padded}.parquet"
    path = Path(workdir) / name
    if not path.exists():
        write_synthetic_set(data, path, tokenizer)
    return path


def train_files(
    data: DataConfig, workdir: str | Path, tokenizer: PreTrainedTokenizerBase | None = None
) -> list[Path]:
    """data.train_files, or the synthetic set (written once into ``workdir``) when it is empty."""
    return [Path(p) for p in data.train_files] if data.train_files else [synthetic_path(data, workdir, tokenizer)]


def load_train_dataset(data: DataConfig, tokenizer: PreTrainedTokenizerBase, workdir: str | Path) -> PromptDataset:
    """Load every train file (all validated before any is used) into one prompt set. Each file needs
    what the trainer reads, not the reference schema: any text RL file VERL's preprocessors write loads;
    multi-modal ones are refused."""
    loaded = [
        load_prompts(
            path,
            tokenizer,
            data.max_prompt_length,
            truncation=data.truncation,
            filter_overlong_prompts=data.filter_overlong_prompts,
            strict=False,
        )
        for path in train_files(data, workdir, tokenizer)
    ]
    if len(loaded) == 1:
        return loaded[0]
    prompts = [replace(p, uid=f"{i}:{p.uid}") for i, ds in enumerate(loaded) for p in ds.prompts]
    first = loaded[0]
    return PromptDataset(
        source=", ".join(ds.source for ds in loaded),
        max_prompt_length=first.max_prompt_length,
        truncation=first.truncation,
        prompts=prompts,
        dropped_rows=[r for ds in loaded for r in ds.dropped_rows],
        num_rows=sum(ds.num_rows for ds in loaded),
    )
