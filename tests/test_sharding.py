"""trainer.driver.sharding: how rows are spread over data-parallel workers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer.driver.sharding import balanced_mini_batch_shards, even_split, mini_batch_shards


def test_even_split_by_hand():
    assert even_split(5, 2) == [[0, 1, 2], [3, 4]]
    assert even_split(2, 3) == [[0], [1], []]


@given(st.integers(0, 200), st.integers(1, 9))
def test_even_split_covers_every_row_once(n, parts):
    split = even_split(n, parts)
    assert [i for s in split for i in s] == list(range(n))
    assert max(map(len, split)) - min(map(len, split)) <= 1


def test_mini_batch_shards_by_hand():
    # 8 rows, mini-batches of 4, 2 workers: mini 0 = rows 0-3, mini 1 = rows 4-7
    assert mini_batch_shards(8, 4, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert mini_batch_shards(8, 4, 1) == [list(range(8))]


@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4))
def test_worker_blocks_form_each_global_mini_batch(n_mini, per_worker, world):
    m = per_worker * world
    shards = mini_batch_shards(n_mini * m, m, world)
    for k in range(n_mini):
        block = sorted(i for s in shards for i in s[k * per_worker : (k + 1) * per_worker])
        assert block == list(range(k * m, (k + 1) * m))


def test_uneven_layouts_are_refused():
    with pytest.raises(ValueError, match="do not split into mini-batches"):
        mini_batch_shards(10, 4, 1)
    with pytest.raises(ValueError, match="does not split over 3 workers"):
        mini_batch_shards(8, 4, 3)


def test_balanced_shards_keep_each_mini_batch_and_even_out_the_tokens():
    # two mini-batches of 8 rows over 2 workers; contiguous blocks would give worker 0 the 4 long rows
    lengths = [900, 800, 700, 600, 10, 20, 30, 40] * 2
    shards = balanced_mini_batch_shards(lengths, 8, 2)
    for k in range(2):
        block = sorted(i for s in shards for i in s[k * 4 : (k + 1) * 4])
        assert block == list(range(k * 8, (k + 1) * 8)), shards  # mini-batch k keeps exactly its rows
    tokens = [sum(lengths[i] for i in s) for s in shards]
    plain = [sum(lengths[i] for i in s) for s in mini_batch_shards(16, 8, 2)]
    assert max(tokens) - min(tokens) <= 40, (tokens, shards)
    assert max(plain) - min(plain) == 2 * 2900, plain  # what balancing removed
    assert balanced_mini_batch_shards(lengths, 8, 1) == mini_batch_shards(16, 8, 1)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.data())
def test_balanced_worker_blocks_form_each_global_mini_batch(n_mini, per_worker, world, data):
    m = per_worker * world
    lengths = data.draw(st.lists(st.integers(1, 30_000), min_size=n_mini * m, max_size=n_mini * m))
    shards = balanced_mini_batch_shards(lengths, m, world)
    assert [len(s) for s in shards] == [n_mini * per_worker] * world
    for k in range(n_mini):
        block = sorted(i for s in shards for i in s[k * per_worker : (k + 1) * per_worker])
        assert block == list(range(k * m, (k + 1) * m))


def test_balanced_shards_refuse_what_plain_shards_refuse():
    with pytest.raises(ValueError, match="does not split over 3 workers"):
        balanced_mini_batch_shards([1] * 8, 4, 3)
