"""The reward's text: the direct decode gives what ``tokenizer.batch_decode`` gives, row for row."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trainer.driver.response_text import decode_rows, decodes_directly, response_texts
from trainer.models.tokenizer import build_tokenizer

TEXT = "Let x = 3, so 2x + 1 = 7 . The answer is \\boxed{7} , isn't it ? 1,000 / 2 = 500 ."


def _bpe_tokenizer(clean_up: bool) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained here (nothing downloaded), with two special tokens."""
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(
        [TEXT] * 20,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|pad|>"], show_progress=False),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|pad|>", clean_up_tokenization_spaces=clean_up
    )


def _rows(tokenizer, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """n responses of the text's tokens with an end-of-text token inside (skipped as special), right-padded
    to one width, and a mask with a hole in one row (only the mask's positions are decoded)."""
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    rows = [ids[: len(ids) - 3 * i] + [tokenizer.eos_token_id] + ids[:i] for i in range(n)]
    width = max(map(len, rows))
    response_ids = torch.full((n, width), tokenizer.pad_token_id)
    response_mask = torch.zeros((n, width), dtype=torch.long)
    for r, row in enumerate(rows):
        response_ids[r, : len(row)] = torch.tensor(row)
        response_mask[r, : len(row)] = 1
    response_mask[2, 5:9] = 0
    return response_ids, response_mask


def _expected(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    return tokenizer.batch_decode(
        [ids[mask.bool()].tolist() for ids, mask in zip(response_ids, response_mask, strict=True)],
        skip_special_tokens=True,
    )


def test_the_character_tokenizer_and_a_bpe_one_decode_directly_to_batch_decode_s_text() -> None:
    for tokenizer in (build_tokenizer(), _bpe_tokenizer(clean_up=False)):
        assert decodes_directly(tokenizer)
        response_ids, response_mask = _rows(tokenizer)
        got = response_texts(tokenizer, response_ids, response_mask)
        want = _expected(tokenizer, response_ids, response_mask)
        assert got == want
        assert "boxed{7}" in got[0] and "<|endoftext|>" not in "".join(got)
        assert len(got[2]) < len(got[3])  # the masked hole is left out


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_batch_decode() -> None:
    tokenizer = _bpe_tokenizer(clean_up=True)
    assert not decodes_directly(tokenizer)
    response_ids, response_mask = _rows(tokenizer)
    assert response_texts(tokenizer, response_ids, response_mask) == _expected(tokenizer, response_ids, response_mask)


def test_a_tokenizer_without_a_rust_decoder_is_asked_for_batch_decode() -> None:
    class Plain:  # a slow tokenizer's interface: batch_decode only
        def batch_decode(self, rows, skip_special_tokens):
            assert skip_special_tokens
            return ["|".join(map(str, row)) for row in rows]

    assert not decodes_directly(Plain())
    assert decode_rows(Plain(), [[1, 2], [3]]) == ["1|2", "3"]
