"""Model presets (real architectures with random weights) and local model directories.

Presets build the architecture from a config, so nothing is downloaded: ``tiny`` trains in seconds on
a CPU (``tiny-hd64``: a little wider, with heads of 64 for vLLM's CPU attention); ``r1-distill-qwen-1.5b``
and ``r1-distill-qwen-7b`` are the DeepSeek-R1-Distill-Qwen-1.5B and -7B architectures (Qwen2, from
their Hugging Face config.json). A path loads through transformers' ``from_pretrained``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, Qwen2Config

from trainer.models.flops import DecoderArch, flops_params, parameter_count
from trainer.models.tokenizer import VOCAB_SIZE, build_tokenizer


class ModelError(ValueError):
    """A model name or directory that cannot be used; the message names it and what was expected."""


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


# The Qwen2Config fields a preset sets, in the order of the numbers in PRESET_ARCHITECTURES.
ARCH_FIELDS: tuple[str, ...] = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
)
# The 1.5B and 7B rows are the config.json of the Hugging Face model cards
# deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B and deepseek-ai/DeepSeek-R1-Distill-Qwen-7B
# (head_dim there is hidden_size / num_attention_heads). tiny is ours: a CPU-sized Qwen2. tiny-hd64 is
# the plugin's default model when vLLM rolls out on CPU (pytest_rlbench/options/trainer_config.py): vLLM's CPU
# attention refuses head_dim 16 and takes 64, and vLLM's Qwen2 derives head_dim as hidden_size /
# num_attention_heads (vllm/model_executor/models/qwen2.py), so the width is 2 heads of 64.
PRESET_ARCHITECTURES: dict[str, tuple[int | bool, ...]] = {
    # vocab, hidden, ffn, layers, heads, kv heads, head_dim, max positions, tied embeddings
    "tiny": (_round_up(VOCAB_SIZE, 64), 64, 192, 2, 4, 2, 16, 4096, True),
    "tiny-hd64": (_round_up(VOCAB_SIZE, 64), 128, 256, 2, 2, 1, 64, 4096, True),
    "r1-distill-qwen-1.5b": (151936, 1536, 8960, 28, 12, 2, 128, 131072, False),
    "r1-distill-qwen-7b": (152064, 3584, 18944, 28, 28, 4, 128, 131072, False),
}
# Set alike in all three (the model cards' values).
SHARED_CONFIG: dict[str, Any] = {"rope_theta": 10000.0, "rms_norm_eps": 1e-6}


def preset_fields(numbers: tuple[int | bool, ...]) -> dict[str, Any]:
    """Qwen2Config keyword arguments from one row of PRESET_ARCHITECTURES."""
    return {**dict(zip(ARCH_FIELDS, numbers, strict=True)), **SHARED_CONFIG}


PRESETS: dict[str, dict[str, Any]] = {name: preset_fields(row) for name, row in PRESET_ARCHITECTURES.items()}

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """``auto`` is fp32 on CPU (bf16 matmuls are slow there) and bf16 on GPU."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name not in DTYPES:
        raise ModelError(f"unknown dtype {name!r}; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class ModelSpec:
    """What a benchmark report needs to know about a model: its name, source and architecture."""

    name: str
    source: str  # "preset" or the directory it was loaded from
    arch: DecoderArch
    model_type: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def parameter_count(self) -> int:
        return parameter_count(self.arch)

    @property
    def flops_params(self) -> int:
        return flops_params(self.arch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "model_type": self.model_type,
            "parameters": self.parameter_count,
            "arch": self.arch.to_dict(),
        }


def arch_from_config(config: PretrainedConfig) -> DecoderArch:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return DecoderArch(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )


def is_preset(name: str) -> bool:
    return name in PRESETS


def preset_config(name: str) -> Qwen2Config:
    if name not in PRESETS:
        raise ModelError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    tok = build_tokenizer()
    return Qwen2Config(
        **PRESETS[name],
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        use_cache=True,
    )


def check_model_dir(path: str | Path) -> Path:
    """Raise ModelError naming ``path`` unless it is a directory with a readable config.json."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model path {str(p)!r} does not exist; give a preset ({', '.join(PRESETS)}) or a model directory")
    if not p.is_dir():
        raise ModelError(f"model path {str(p)!r} is not a directory; expected a Hugging Face model directory with config.json")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ModelError(f"{str(p)!r} is not a model directory: no config.json in it (found: {', '.join(sorted(x.name for x in p.iterdir())[:8]) or 'nothing'})")
    try:
        json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{cfg}: not readable JSON ({exc})") from exc
    return p


def model_spec(name_or_path: str) -> ModelSpec:
    """The spec without building weights (cheap: used at start-up and for reports)."""
    if is_preset(name_or_path):
        config: PretrainedConfig = preset_config(name_or_path)
        source = "preset"
    else:
        path = check_model_dir(name_or_path)
        try:
            config = AutoConfig.from_pretrained(path)
        except Exception as exc:  # transformers raises several types for a bad config
            raise ModelError(f"{str(path)!r}: config.json could not be read by transformers: {exc}") from exc
        source = str(path)
    try:
        arch = arch_from_config(config)
    except AttributeError as exc:
        raise ModelError(f"{name_or_path!r}: not a dense decoder config ({exc})") from exc
    return ModelSpec(name=name_or_path, source=source, arch=arch, model_type=config.model_type)


def load_tokenizer(name_or_path: str):
    """Presets use the built-in character tokenizer; a directory uses its own if it has one."""
    if is_preset(name_or_path):
        return build_tokenizer()
    path = check_model_dir(name_or_path)
    has_tokenizer = any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    if not has_tokenizer:
        return build_tokenizer()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def build_model(
    name_or_path: str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> torch.nn.Module:
    """A causal LM: a preset with seeded random weights, or a directory via from_pretrained."""
    if is_preset(name_or_path):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(preset_config(name_or_path), dtype=dtype)
    else:
        path = check_model_dir(name_or_path)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except Exception as exc:  # missing weights, wrong architecture, ...
            raise ModelError(f"{str(path)!r}: from_pretrained failed: {exc}") from exc
        model = model.to(device)
    model.config.use_cache = False  # training forward passes; the rollout asks for a cache itself
    return model


def save_preset(name: str, directory: str | Path, seed: int = 0) -> Path:
    """Write a preset as a Hugging Face model directory (config, weights, tokenizer)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model = build_model(name, seed=seed)
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path
