"""What the driver spends per step on work that grows with the rows, at the 1.5B replay's 4-GPU shape (issue 31).

    python benchmarks/driver_costs.py [--rows 256] [--repeats 3] [--json OUT.json]

Three measurements, each the median of ``--repeats``, each beside what the driver did before:

- decode: the reward's text of ``--rows`` responses of lognormal lengths (mean 14,255 tokens, capped at
  27,648, the 1.5B replay's) through the character tokenizer: ``tokenizer.batch_decode`` against
  ``trainer.driver.response_text.response_texts``; once with ids outside the tokenizer's vocabulary (as
  the random-weight replay samples them) and once inside it (every id a character).
- last number: the reward's last number of texts of 9,000 words and numbers (about 35k characters),
  with no boxed answer (a response cut off at the length cap): a scan of the whole text against
  ``trainer.driver.reward.last_number``.
- ship: a batch's parts sent to 4 Ray actors that only take them (an embedded Ray on 127.0.0.1), as a
  training phase sends them: every field of the batch at update_actor against ``Batch.select``'s
  ``only`` (the rows alone, as old_log_prob and ref send; the rows and ``UPDATE_INPUTS``, as
  update_actor sends).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer.batch import Batch  # noqa: E402
from trainer.driver.grpo_trainer import UPDATE_INPUTS  # noqa: E402
from trainer.driver.response_text import response_texts, response_token_lists  # noqa: E402
from trainer.driver.reward import _NUMBER_RE, last_number  # noqa: E402
from trainer.models.tokenizer import VOCAB_SIZE, build_tokenizer  # noqa: E402

PROMPT, RESPONSE, MEAN_RESPONSE = 1024, 27648, 14255  # the 1.5B replay's widths and mean response length
WORDS = "the so we have let x y then = + - * / ( ) , . number answer is of and step 12 3.5 1,000 \\frac{1}{2}".split()


def median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def responses(rows: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, RESPONSE] ids below ``vocab`` and a right-padded mask of lognormal lengths (sigma 0.5)."""
    sigma = 0.5
    lengths = (torch.randn(rows, generator=gen) * sigma + torch.log(torch.tensor(MEAN_RESPONSE)) - sigma**2 / 2).exp()
    lengths = lengths.clamp(1, RESPONSE).long()  # [rows]
    ids = torch.randint(0, vocab, (rows, RESPONSE), generator=gen)  # [rows, R]
    mask = (torch.arange(RESPONSE)[None, :] < lengths[:, None]).long()  # [rows, R]
    return ids, mask


def decode(rows: int, repeats: int) -> dict[str, float]:
    tokenizer, gen, out = build_tokenizer(), torch.Generator().manual_seed(0), {}
    for name, vocab in (("ids outside the vocabulary", 151936), ("ids inside it", VOCAB_SIZE)):
        ids, mask = responses(rows, vocab, gen)
        before = lambda ids=ids, mask=mask: tokenizer.batch_decode(response_token_lists(ids, mask), skip_special_tokens=True)  # noqa: E731
        out[f"{name}: batch_decode s"] = median_s(before, repeats)
        out[f"{name}: response_texts s"] = median_s(lambda ids=ids, mask=mask: response_texts(tokenizer, ids, mask), repeats)
    return out


def numbers(rows: int, repeats: int) -> dict[str, float]:
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(9000)) for _ in range(rows)]
    assert all(last_number(t) == _NUMBER_RE.findall(t)[-1] for t in texts)
    return {
        "characters a text": statistics.mean(map(len, texts)),
        "whole scan s": median_s(lambda: [_NUMBER_RE.findall(t)[-1] for t in texts], repeats),
        "last_number s": median_s(lambda: [last_number(t) for t in texts], repeats),
    }


def ship(rows: int, repeats: int) -> dict[str, float]:
    import ray

    def wide() -> torch.Tensor:
        return torch.zeros(rows, RESPONSE)

    batch = Batch(
        prompt_ids=torch.zeros(rows, PROMPT, dtype=torch.long), prompt_mask=torch.ones(rows, PROMPT, dtype=torch.long),
        response_ids=torch.zeros(rows, RESPONSE, dtype=torch.long),
        response_mask=torch.ones(rows, RESPONSE, dtype=torch.long), uids=torch.arange(rows),
        ground_truths=["1"] * rows, rollout_log_probs=wide(), token_level_scores=wide(), token_level_rewards=wide(),
        old_log_probs=wide(), ref_log_probs=wide(), advantages=wide(), returns=wide(),
    )  # fmt: skip
    workers = 4
    shards = [list(range(w, rows, workers)) for w in range(workers)]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:

        @ray.remote(num_cpus=0)
        class Taker:
            def take(self, part: Batch) -> int:
                return part.size

        takers = [Taker.remote() for _ in range(workers)]
        ray.get([t.take.remote(batch.select([0])) for t in takers])  # started
        out = {}
        for name, only in (("every field", None), ("rows only", ()), ("rows and UPDATE_INPUTS", UPDATE_INPUTS)):

            def send(only=only) -> None:
                parts = [batch.select(rows_of, only=only) for rows_of in shards]
                ray.get([t.take.remote(p) for t, p in zip(takers, parts, strict=True)])

            part = batch.select(shards[0], only=only)
            out[f"{name}: MB a worker"] = sum(t.numel() * t.element_size() for t in part.tensors().values()) / 1e6
            out[f"{name}: select and ship s"] = median_s(send, repeats)
        return out
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256, help="the step's rows (the 1.5B replay on 4 GPUs: 256)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.rows < 4 or args.repeats < 1:
        ap.error("--rows must be at least 4 (one a worker) and --repeats at least 1")
    result = {
        "rows": args.rows,
        "decode": decode(args.rows, args.repeats),
        "last number": numbers(args.rows, args.repeats),
        "ship": ship(args.rows, args.repeats),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
