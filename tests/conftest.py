"""Shared set-up for the project's own tests: the plugin's tests drive pytest through pytester."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from trainer.driver.ray_local import use_loopback

pytest_plugins = ["pytester"]

# Every Ray these tests start (local, or a ray.cluster_utils.Cluster) listens on 127.0.0.1 only.
use_loopback()
# Ray 2.60 turns token authentication on for a process's clusters once a local ray.init() has written
# ~/.ray/auth_token, and keeps the mode per process. The pytest sessions these tests start through
# pytester run with pytester's own HOME and could not read that token, so whether a test passes would
# depend on which test started Ray first. One mode for the whole test run: off (loopback-only clusters).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# What pytest-xdist tells its workers through the environment. A pytest session a test starts (pytester,
# in process or in a subprocess) would inherit it, and pytest-benchmark reads PYTEST_XDIST_WORKER to
# disable every benchmark of a parallel run: the inner session would run no benchmark at all.
XDIST_WORKER_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


@pytest.fixture(scope="session", autouse=True)
def _sessions_started_by_tests_are_not_xdist_workers() -> Iterator[None]:
    """Under ``pytest tests/ -n 2`` the tests run with xdist's worker variables removed, so the pytest
    sessions they start behave as they do under a plain ``pytest tests/`` (restored at the end).
    Session-scoped, so that module fixtures starting a session (test_replay's ``saved``) see it too."""
    with pytest.MonkeyPatch.context() as patch:
        for name in XDIST_WORKER_ENV:
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(scope="session")
def plugin_deps_loaded() -> None:
    """Import what the plugin's in-process runs use, once, before pytester snapshots sys.modules.

    An in-process pytester run drops every module first imported inside it; torch and matplotlib cannot
    be imported a second time in one process, and re-importing transformers' lazy modules or hypothesis costs seconds a run."""
    import hypothesis  # noqa: F401  (its pytest plugin imports it at the end of every run)
    import matplotlib.backends.backend_agg  # noqa: F401  (the chart; matplotlib breaks when imported twice)
    import matplotlib.figure  # noqa: F401
    import matplotlib.patches  # noqa: F401
    import matplotlib.ticker  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.manual_seed imports it on first use; it cannot be imported twice)

    import trainer.data.source  # noqa: F401
    import trainer.rollout  # noqa: F401  (the registries the session's config check reads)
    from trainer.models.presets import load_tokenizer, model_spec

    model_spec("tiny")
    load_tokenizer("tiny")


@pytest.fixture(scope="session")
def two_node_cluster_address():
    """A real two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head and a second node,
    one CPU each, both on 127.0.0.1), started once for the whole test run (a start costs about 10 s
    on a small machine) and stopped at its end; yields the head's address. Nothing here connects to
    it: ``two_node_cluster`` does, per module, and the plugin's sessions do through the address."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def two_node_cluster(two_node_cluster_address):
    """This process connected to the shared two-node cluster for the module's tests, disconnected
    after (the cluster itself runs on: ``two_node_cluster_address``)."""
    import ray

    ray.init(address=two_node_cluster_address, log_to_driver=False)
    yield
    ray.shutdown()


# ----------------------------------------------------------------------------- rollout engines
ROLLOUT_TEXTS = ["What is 2+3?", "Hi", "Compute 17*4 please", "x", "Solve: 9-4", "abc", "The answer is", "1+1="]


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module: tiny matmuls gain nothing from threads, and on a busy small
    machine spinning threads make these tests many times slower. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tok():
    """The tiny preset's tokenizer."""
    from trainer.models.presets import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="session")
def prompts(tok) -> list[list[int]]:
    """Eight short prompts of different lengths, tokenized."""
    return [tok.encode(t) for t in ROLLOUT_TEXTS]


@pytest.fixture(scope="session")
def liven():
    """A function that scales a tiny model so that its greedy text varies and sometimes ends with EOS.

    At its initial scale a random tiny model repeats the prompt's last character forever; rollout
    tests need responses that end at different steps (EOS embedding x2 makes EOS likelier)."""
    import torch

    from trainer.models.tokenizer import build_tokenizer

    eos = build_tokenizer().eos_token_id

    def scale(model):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2 and "embed" not in name:
                    p.mul_(4.0)
            model.get_input_embeddings().weight[eos] *= 2.0
        return model

    return scale
