"""Shared set-up for the project's own tests: the plugin's tests drive pytest through pytester."""

from __future__ import annotations

import pytest

from trainer.ray_local import use_loopback

pytest_plugins = ["pytester"]

# Every Ray these tests start (local, or a ray.cluster_utils.Cluster) listens on 127.0.0.1 only.
use_loopback()


@pytest.fixture(scope="session")
def plugin_deps_loaded() -> None:
    """Import what the plugin's in-process runs use, once, before pytester snapshots sys.modules.

    An in-process pytester run drops every module first imported inside it; torch cannot be imported
    a second time in one process, and re-importing transformers' lazy modules or hypothesis costs seconds a run."""
    import hypothesis  # noqa: F401  (its pytest plugin imports it at the end of every run)
    import pyarrow.parquet  # noqa: F401

    import trainer.data.source  # noqa: F401
    from trainer.models import load_tokenizer, model_spec

    model_spec("tiny")
    load_tokenizer("tiny")
