"""Where the training prompts come from: data.train_files, or the synthetic math set when empty."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from trainer.config import DataConfig
from trainer.data.loader import PromptDataset, load_prompts
from trainer.data.synthetic import write_synthetic_parquet


def synthetic_path(data: DataConfig, workdir: str | Path) -> Path:
    """Write (once) the synthetic set that ``data`` describes into ``workdir``; return its path."""
    name = f"synthetic_math_{data.synthetic_difficulty}_n{data.synthetic_size}_seed{data.seed}.parquet"
    path = Path(workdir) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write_synthetic_parquet(tmp, data.synthetic_size, data.seed, difficulty=data.synthetic_difficulty)
        tmp.replace(path)  # never leave a half-written file under the final name
    return path


def train_files(data: DataConfig, workdir: str | Path) -> list[Path]:
    return [Path(p) for p in data.train_files] if data.train_files else [synthetic_path(data, workdir)]


def load_train_dataset(data: DataConfig, tokenizer: PreTrainedTokenizerBase, workdir: str | Path) -> PromptDataset:
    """Load every train file (all validated before any is used) into one prompt set."""
    loaded = [
        load_prompts(
            path,
            tokenizer,
            data.max_prompt_length,
            truncation=data.truncation,
            filter_overlong_prompts=data.filter_overlong_prompts,
        )
        for path in train_files(data, workdir)
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
