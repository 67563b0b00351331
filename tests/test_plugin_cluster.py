"""rl_cluster and the start-up checks against real Ray clusters, plus the pure checking functions.

Ray starts are slow on a small machine, so one two-node ``ray.cluster_utils.Cluster`` (127.0.0.1
only) serves every test that needs several nodes, and each pytest session under test runs in a
subprocess, as a user's would.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_rlbench.session.cluster import (
    ClusterInfo,
    NodeInfo,
    check_cluster,
    describe_nodes,
    is_loopback,
    precheck_embedded,
    resolve_gpus_per_node,
)

RUN_TIMEOUT = 180  # seconds for one pytest subprocess


# ----------------------------------------------------------------------------- pure checks
def raw_node(
    node_id: str, ip: str, gpus: int = 0, alive: bool = True, head: bool = False, gpu_type: str | None = None
) -> dict[str, Any]:
    """A node as ``ray.nodes()`` reports it (the fields the plugin reads)."""
    resources: dict[str, float] = {"CPU": 8.0, "memory": 1e9, "object_store_memory": 5e8, f"node:{ip}": 1.0}
    if gpus:
        resources["GPU"] = float(gpus)
    if gpu_type:
        resources[f"accelerator_type:{gpu_type}"] = 1.0
    if head:
        resources["node:__internal_head__"] = 1.0
    return {
        "NodeID": node_id * 8,
        "Alive": alive,
        "NodeManagerAddress": ip,
        "NodeManagerHostname": f"h-{ip}",
        "Resources": resources,
    }


def info_of(
    *nodes: dict[str, Any], local_ip: str | None = None, local_model: str | None = None
) -> ClusterInfo:
    return ClusterInfo(
        address="10.0.0.1:6379",
        embedded=False,
        nodes=describe_nodes(list(nodes), local_ip, local_model),
        cpu_model="cpu",
        hostname="h",
        ray_version="x",
        torch_version="y",
    )


def test_describe_nodes_keeps_alive_nodes_head_first_with_gpu_models() -> None:
    info = info_of(
        raw_node("b", "10.0.0.2", gpus=8, gpu_type="H100"),
        raw_node("a", "10.0.0.1", gpus=8, head=True),
        raw_node("c", "10.0.0.3", gpus=8, alive=False),
        local_ip="10.0.0.1",
        local_model="NVIDIA H100 80GB HBM3",
    )
    assert [n.ip for n in info.nodes] == ["10.0.0.1", "10.0.0.2"]
    head, worker = info.nodes
    assert head.is_head and head.gpu_model == "NVIDIA H100 80GB HBM3"  # from torch: this machine
    assert worker.gpu_model == "H100" and worker.gpus == 8 and worker.cpus == 8
    assert info.node_count == 2 and info.total_gpus == 16
    assert info.to_dict()["nodes"][1]["node_id"] == "b" * 8


def test_check_cluster_says_what_was_asked_and_what_the_cluster_has() -> None:
    info = info_of(raw_node("a", "10.0.0.1", gpus=8, head=True), raw_node("b", "10.0.0.2", gpus=4))
    assert check_cluster(info, nodes=2, gpu=True, gpus_per_node=4) is None
    assert check_cluster(info, nodes=2, gpu=False, gpus_per_node=None) is None
    short = check_cluster(info, nodes=3, gpu=False, gpus_per_node=None)
    assert short == (
        "--rl-nodes=3 asks for 3 alive Ray nodes; the cluster at 10.0.0.1:6379 has 2 "
        "(node ids aaaaaaaa at 10.0.0.1, bbbbbbbb at 10.0.0.2)"
    )
    gpus = check_cluster(info, nodes=2, gpu=True, gpus_per_node=8)
    assert gpus is not None
    assert "--rl-gpus-per-node=8 asks for 2 node(s) with at least 8 GPU(s) each" in gpus
    assert "has 1 such node(s) (GPUs per node: aaaaaaaa at 10.0.0.1: 8, bbbbbbbb at 10.0.0.2: 4)" in gpus


def test_all_visible_gpus_means_the_smallest_of_the_nodes_used() -> None:
    info = info_of(raw_node("a", "1", gpus=8), raw_node("b", "2", gpus=8), raw_node("c", "3", gpus=4))
    assert resolve_gpus_per_node(info, 2) == 8
    assert resolve_gpus_per_node(info, 3) == 4
    assert resolve_gpus_per_node(info_of(raw_node("a", "1")), 1) == 0


def test_an_embedded_ray_is_refused_more_nodes_or_gpus_than_this_machine_has() -> None:
    assert precheck_embedded(1, False, None, visible_gpus=0) is None
    assert precheck_embedded(1, True, 2, visible_gpus=2) is None
    nodes = precheck_embedded(2, False, None, visible_gpus=0)
    assert nodes is not None and nodes.startswith(
        "--rl-nodes=2 asks for 2 alive Ray nodes; the embedded local Ray has 1"
    )
    gpus = precheck_embedded(1, True, 4, visible_gpus=2)
    assert (
        gpus is not None
        and "--rl-gpus-per-node=4 asks for a node with at least 4 GPU(s)" in gpus
        and "has 2 visible" in gpus
    )
    assert (
        is_loopback("127.0.0.1:6379")
        and is_loopback("ray://localhost:10001")
        and not is_loopback("10.0.0.1:6379")
    )


def test_node_info_names_itself_by_a_short_id() -> None:
    node = NodeInfo("f" * 56, "10.0.0.9", "h", 1.0, 0.0, None, 1, 1, False)
    assert node.describe() == "ffffffffffff at 10.0.0.9"


# ----------------------------------------------------------------------------- real clusters
@pytest.fixture(scope="module")
def two_node_cluster(two_node_cluster_address: str) -> str:
    """A head and one worker node (1 CPU each) on 127.0.0.1 (tests/conftest.py, shared by the test run):
    the head's address, which this module's sessions join; this process does not connect."""
    return two_node_cluster_address


CLUSTER_TEST = """
import json, pathlib, ray

def test_cluster(rl_cluster, rl_options, rl_config):
    pathlib.Path("ran").write_text("yes")
    assert ray.is_initialized()
    pathlib.Path("cluster.json").write_text(json.dumps(rl_cluster.to_dict()))
    assert rl_config.trainer.nnodes == rl_options.nodes
"""


def ports_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_two_node_cluster_satisfies_rl_nodes_2(pytester: pytest.Pytester, two_node_cluster: str) -> None:
    pytester.makepyfile(CLUSTER_TEST)
    result = pytester.runpytest_subprocess(
        f"--rl-ray-address={two_node_cluster}", "--rl-nodes=2", timeout=RUN_TIMEOUT
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [f"rlbench: *2 node(s), cpu, ray {two_node_cluster} (from --rl-ray-address)*"]
    )
    info = json.loads((pytester.path / "cluster.json").read_text())
    assert info["address"] == two_node_cluster and not info["embedded"]
    assert info["node_count"] == 2
    assert [n["cpus"] for n in info["nodes"]] == [1.0, 1.0]
    assert [n["ip"] for n in info["nodes"]] == ["127.0.0.1", "127.0.0.1"]
    assert info["nodes"][0]["is_head"] and not info["nodes"][1]["is_head"]
    assert info["ray_version"] and info["torch_version"] and info["cpu_model"] and info["hostname"]
    # only our connection was dropped: the cluster is still up for the next test
    assert ports_listening(int(two_node_cluster.rsplit(":", 1)[1]))


def test_too_few_nodes_end_the_session_before_any_test(
    pytester: pytest.Pytester, two_node_cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(CLUSTER_TEST)
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster)  # the default address, without the option
    result = pytester.runpytest_subprocess("--rl-nodes=4", timeout=RUN_TIMEOUT)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*--rl-nodes=4 asks for 4 alive Ray nodes; the cluster at {two_node_cluster} has 2 (node ids * at 127.0.0.1, * at 127.0.0.1)*"
        ]
    )
    assert not (pytester.path / "ran").exists()


def test_gpu_on_a_cluster_without_gpus_ends_the_session(
    pytester: pytest.Pytester, two_node_cluster: str
) -> None:
    pytester.makepyfile(CLUSTER_TEST)
    result = pytester.runpytest_subprocess(
        f"--rl-ray-address={two_node_cluster}", "--gpu", timeout=RUN_TIMEOUT
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*--gpu asks for 1 node(s) with at least 1 GPU(s) each; the cluster at {two_node_cluster} has 0 such node(s)*"
        ]
    )
    assert not (pytester.path / "ran").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--rl-nodes=2"],
            "*--rl-nodes=2 asks for 2 alive Ray nodes; the embedded local Ray has 1 (this machine*",
        ),
        (
            ["--gpu"],
            "*--gpu asks for a node with at least 1 GPU(s); the embedded local Ray would run on this machine*0 visible GPU(s)*",
        ),
    ],
)
@pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py
def test_the_embedded_ray_refuses_what_it_cannot_have_before_any_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:
    # In-process: the refusal comes before Ray starts, so this session starts nothing a subprocess
    # would have to contain (and saves the subprocess's seconds of imports).
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pytester.makepyfile(CLUSTER_TEST)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert not (pytester.path / "ran").exists()


def test_the_embedded_ray_starts_on_loopback_and_stops_even_after_a_keyboard_interrupt(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pytester.makepyfile(
        """
        import json, pathlib

        def test_a_cluster(rl_cluster):
            pathlib.Path("cluster.json").write_text(json.dumps(rl_cluster.to_dict()))

        def test_b_interrupted():
            raise KeyboardInterrupt

        def test_c_never_runs():
            pathlib.Path("ran-c").write_text("yes")
        """
    )
    result = pytester.runpytest_subprocess(timeout=RUN_TIMEOUT)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert not (pytester.path / "ran-c").exists()
    info = json.loads((pytester.path / "cluster.json").read_text())
    assert info["embedded"] and info["node_count"] == 1
    host, port = info["address"].rsplit(":", 1)
    assert host == "127.0.0.1" and info["nodes"][0]["ip"] == "127.0.0.1"
    assert info["nodes"][0]["cpus"] >= 1
    assert not ports_listening(int(port)), "the embedded Ray's GCS still listens after the session"


def test_plain_tests_never_start_ray_or_import_torch(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_plain():
            assert "ray" not in sys.modules
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("--rl-nodes=4", timeout=RUN_TIMEOUT)  # nothing checks 4 nodes
    result.assert_outcomes(passed=1)


def test_the_embedded_ray_runs_workers_at_the_session_s_priority() -> None:
    # Ray's default nice 15 put the timed phases below Ray's own background processes
    import ray

    from pytest_rlbench.session.cluster import RayConnection

    connection = RayConnection.open(None, num_cpus=1)
    try:
        @ray.remote
        def priority() -> int:
            return os.getpriority(os.PRIO_PROCESS, 0)

        assert ray.get(priority.remote()) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        connection.close()


RAY_NODES = Path(__file__).resolve().parents[1] / "benchmarks" / "ray_nodes.py"


def test_a_cluster_that_refuses_the_token_is_named_at_once(pytester: pytest.Pytester) -> None:
    """A cluster under Ray's token authentication (benchmarks/ray_nodes.py starts one, its own token
    in RAY_AUTH_TOKEN), joined with another token: the session ends before any test with Ray's words
    on the token, where ray.init alone said only that it could not connect."""
    pytester.makepyfile(CLUSTER_TEST)
    inner = "RAY_AUTH_TOKEN=not-$RAY_AUTH_TOKEN exec python -m pytest -p no:cacheprovider --rl-ray-timeout=20"
    result = pytester.run(sys.executable, str(RAY_NODES), "1", "--", "bash", "-c", inner, timeout=RUN_TIMEOUT)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret not in (0, 2), out[-3000:]  # 2 would be the nodes not coming up
    assert not (pytester.path / "ran").exists(), out[-3000:]
    assert "could not start or reach RAY_ADDRESS=" in out, out[-3000:]
    assert "refused this process's token" in out and "RAY_AUTH_TOKEN" in out, out[-3000:]
