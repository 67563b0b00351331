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


@pytest.fixture(scope="module")
def two_node_cluster():
    """A real two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head and a second
    node, one CPU each, both on 127.0.0.1), connected for the module's tests and stopped after."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
