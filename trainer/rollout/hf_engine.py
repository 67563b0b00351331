"""The transformers engine: ``model.generate`` on left-padded micro-batches (name "hf").

The reference engine: transformers' own decode loop, cache and samplers (temperature, top-k, top-p,
torch.multinomial). Two things are added: a logits processor that checks every step's logits and
raises NonFiniteLogitsError before multinomial can meet NaN (a device-side assert on a GPU), and
seeding through a forked global RNG, since generate samples from torch's global generator; and a
processor that records each sampled token's log-prob (``SampledLogProbs``). transformers' own
``output_logits`` would give the same raw logits, but keeps every step's [b, V] until generate
returns (b x T x V floats: 80 GB at 128 rows, 1024 tokens and a 152k vocabulary); the processor
keeps one step's.

With rollout.target_lengths, generate runs with ignore_eos semantics to the micro-batch's longest
target; ``RolloutEngine.generate`` then cuts each row to its own target (``mask_to_targets``). A row
shorter than the longest is computed further and thrown away, as in any static batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from trainer.rollout.base import RolloutEngine
from trainer.rollout.requests import GeneratedRows, RowsRequest, SamplingParams
from trainer.rollout.sampling import nonfinite_rows_mask, token_entropies, token_log_probs


class FiniteLogitsCheck(LogitsProcessor):
    """Raise NonFiniteLogitsError naming the step and rows when a step's logits are not finite.

    transformers runs user processors before its sampling warpers (temperature, top-k, top-p);
    those cannot turn finite logits into non-finite ones (each keeps at least one token), so
    checking here covers what multinomial will see. One host read per step: generate already
    makes one per step for its stopping check.
    """

    def __init__(self, request: RowsRequest) -> None:
        self.request = request
        self.prompt_width = request.prompt_ids.shape[1]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        bad = nonfinite_rows_mask(scores)
        if bool(bad.any()):
            step = input_ids.shape[1] - self.prompt_width
            raise self.request.nonfinite("hf", step, torch.nonzero(bad).flatten().tolist())
        return scores


class SampledLogProbs(LogitsProcessor):
    """Record each sampled token's log-prob under the raw logits / temperature (see base.GeneratedRows).

    User processors run before transformers' sampling warpers, so ``scores`` are the raw logits
    (generate's float32 copy). The token sampled from them is known only at the next call (the
    last column of ``input_ids``), or after generate for the last step (``finish``): each call
    scores the previous step's token and keeps this step's logits until then.
    """

    def __init__(self, temperature: float, with_entropy: bool = False) -> None:
        self.temperature = temperature
        self.pending: torch.Tensor | None = None  # [b, V] the last step's raw logits
        self.log_probs: list[torch.Tensor] = []  # one [b] per scored step
        self.entropies: list[torch.Tensor] | None = [] if with_entropy else None  # one [b] per step, if asked

    def _score(self, tokens: torch.Tensor) -> None:
        if self.pending is not None:
            self.log_probs.append(token_log_probs(self.pending, tokens, self.temperature))
            if self.entropies is not None:
                self.entropies.append(token_entropies(self.pending, self.temperature))
        self.pending = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._score(input_ids[:, -1])
        self.pending = scores
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """Score the last step's token; the log-probs [b, T] of the generated tokens [b, T]."""
        self._score(generated[:, -1])
        if len(self.log_probs) != generated.shape[1]:
            raise RuntimeError(f"hf rollout: {len(self.log_probs)} log-prob steps for {generated.shape[1]} tokens")
        return torch.stack(self.log_probs, dim=1)

    def finished_entropies(self) -> torch.Tensor | None:
        """The entropies [b, T] of the steps ``finish`` scored, if asked for."""
        return None if self.entropies is None else torch.stack(self.entropies, dim=1)


class HFRolloutEngine(RolloutEngine):
    name = "hf"
    reports_entropy = True

    @contextlib.contextmanager
    def _seeded(self, seed: int, device: torch.device) -> Iterator[torch.Generator | None]:
        # generate draws from the global RNG: seed it inside a fork so the caller's state is untouched.
        # The CPU state is always forked; an accelerator's only for the model's own device.
        on_cpu = device.type == "cpu"
        # device_type must name a real type even when no device is forked (torch 2.11 rejects None)
        with torch.random.fork_rng(devices=[] if on_cpu else [device], device_type="cuda" if on_cpu else device.type):
            torch.manual_seed(seed)
            yield None

    def generation_config(self, max_new_tokens: int, sampling: SamplingParams) -> GenerationConfig:
        """Every field generate uses, set explicitly so a model's own generation_config.json
        (e.g. a checkpoint's default temperature or repetition penalty) cannot leak in."""
        # Greedy ignores the sampling fields; leaving them unset avoids transformers' "ignored flag" warning.
        sample_args = (
            dict(temperature=sampling.temperature, top_k=sampling.top_k_or_zero, top_p=sampling.top_p)
            if sampling.do_sample
            else {}
        )
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=sampling.do_sample,
            num_beams=1,
            repetition_penalty=1.0,
            eos_token_id=self._generate_eos_ids(),
            pad_token_id=self.pad_token_id,
            use_cache=True,
            return_dict_in_generate=False,
            **sample_args,
        )

    def _generate_eos_ids(self) -> list[int]:
        """What generate stops on. For ignore_eos (or target lengths), an id past the vocabulary that
        no step can sample: with None, generate would fall back to the model's generation_config."""
        if not self.stop_token_ids:
            return [int(self.model.config.vocab_size)]
        return list(self.eos_token_ids)

    def _generate_rows(self, request: RowsRequest) -> GeneratedRows:
        # request.row_keys go unused: transformers samples from the seeded global stream
        width = request.prompt_ids.shape[1]
        sampling = request.sampling
        recorder = SampledLogProbs(sampling.log_prob_temperature, sampling.report_entropy)
        out = self.model.generate(
            input_ids=request.prompt_ids,
            attention_mask=request.prompt_mask,
            generation_config=self.generation_config(request.decode_limit, sampling),
            logits_processor=LogitsProcessorList([FiniteLogitsCheck(request), recorder]),
        )
        tokens = out[:, width:]
        log_probs = recorder.finish(tokens)
        return GeneratedRows(tokens, log_probs, recorder.finished_entropies())
