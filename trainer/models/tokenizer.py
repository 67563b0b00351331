"""A character-level tokenizer built locally, with a Qwen-style chat template.

Nothing can be downloaded, so every preset model comes with this tokenizer: one token per character
of printable ASCII (plus newline), and the chat and end-of-text special tokens. Its vocabulary is
small, which keeps the tiny preset fast on CPU; larger presets keep their own (bigger) embedding.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, IM_START, IM_END, UNK_TOKEN)

# Qwen-style ChatML. The assistant turn ends with <|endoftext|>, the token generation stops on.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CHARACTERS: str = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")


def _vocab() -> dict[str, int]:
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    return {tok: i for i, tok in enumerate(tokens)}


VOCAB_SIZE: int = len(_vocab())


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character tokenizer in memory (deterministic: the same ids every time)."""
    core = Tokenizer(models.WordLevel(vocab=_vocab(), unk_token=UNK_TOKEN))
    # Every character is its own piece; special tokens are matched before this split.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
