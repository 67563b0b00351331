"""Run a command against a Ray cluster of N nodes on this host, as N machines of one GPU each give.

    python3 benchmarks/ray_nodes.py [--logs DIR] N -- COMMAND...

Each node is a ``ray start --block`` in a session of its own, on the host's own address (``ray start``
puts a node there even when told 127.0.0.1), under a token of its own (RAY_AUTH_TOKEN) that every
node and the command get. On a host with GPUs, node i sees GPU i alone (CUDA_VISIBLE_DEVICES=i,
--num-gpus=1), so ``pytest --gpu --rl-nodes N`` places one worker on each node and their
torch.distributed group spans N Ray nodes, as it would span N machines. What it does not give is a
network between them: NCCL still finds the GPUs' NVLink or shared memory on one host, so a figure
from here says nothing of a cluster's interconnect. Without GPUs the nodes are CPU nodes (the host's
logical CPUs shared out, --num-cpus).

COMMAND runs with RAY_ADDRESS set to the head. When it ends, or this script is interrupted, every node
and every process it started is stopped by pid (each node's own session's processes: SIGTERM, then
SIGKILL), none by name. The exit status is COMMAND's (2: the nodes never came up; their logs are in
--logs, a temporary folder by default).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.driver.ray_processes import end_processes, in_sessions  # noqa: E402

NODES_UP_TIMEOUT_S = 120.0
COMMAND_GRACE_S = 60.0  # an interrupted command's time to stop on its own
WORKER_PORTS_PER_NODE = 2000  # each node's own range of worker ports: two raylets never share one
AGENT_LISTEN_PORT = 52365  # Ray's default for the dashboard agent; node i takes this + i


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    """The GPUs nvidia-smi lists on this host (0 without one)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def node_command(index: int, head_port: int, cpus: int, gpus: int) -> list[str]:
    """``ray start`` for node ``index`` (0: the head), its ports apart from every other node's."""
    role = ["--head", f"--port={head_port}", "--include-dashboard=false"]
    if index:
        role = [f"--address=127.0.0.1:{head_port}"]
    low = 10002 + index * WORKER_PORTS_PER_NODE
    return [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *role,
        f"--num-cpus={cpus}", f"--num-gpus={gpus}",
        "--disable-usage-stats",
        f"--dashboard-agent-listen-port={AGENT_LISTEN_PORT + index}",
        f"--min-worker-port={low}", f"--max-worker-port={low + WORKER_PORTS_PER_NODE - 1}",
    ]  # fmt: skip


# Run in a process of its own: a driver's ray.init takes over SIGTERM in the process that calls it
# (and after ray.shutdown a SIGTERM killed this script outright, its nodes left running).
WAITER = """
import sys, time, ray
port, count, deadline = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
alive = []
while time.monotonic() < deadline:
    try:
        if not ray.is_initialized():
            ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, logging_level="ERROR")
        alive = [n for n in ray.nodes() if n.get("Alive")]
    except Exception:  # the head's GCS is not up yet
        alive = []
    if len(alive) >= count:
        head = next(n for n in alive if "node:__internal_head__" in n.get("Resources", {}))
        print(f"{head['NodeManagerAddress']}:{port}")
        sys.exit(0)
    time.sleep(1.0)
print(len(alive))
sys.exit(1)
"""


def wait_for_nodes(head_port: int, count: int, nodes: list[subprocess.Popen], logs: Path) -> str:
    """The head's address (host:port) once ``count`` nodes are alive; exit 2 naming the logs if a node
    dies or they are not all up within NODES_UP_TIMEOUT_S."""
    args = [str(head_port), str(count), str(NODES_UP_TIMEOUT_S)]
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        while waiter.poll() is None:
            if dead := [i for i, p in enumerate(nodes) if p.poll() is not None]:
                sys.exit(
                    f"ray_nodes: node {dead[0]} exited with {nodes[dead[0]].returncode}; see {logs}/node{dead[0]}.log"
                )
            time.sleep(0.5)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    said = waiter.stdout.read().strip() if waiter.stdout else ""
    if waiter.returncode != 0:
        sys.exit(
            f"ray_nodes: {said or 0} of {count} nodes alive after {NODES_UP_TIMEOUT_S:g} s; see the logs in {logs}"
        )
    return said


def stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """End every node and everything it started (raylet, GCS, agents, workers), by pid."""
    sessions = {p.pid for p in nodes}
    left: list[int] = []
    for _ in range(3):  # a raylet can start an agent while it is being stopped: look again
        left = end_processes(in_sessions(sessions))
        if not in_sessions(sessions):
            break
    for p in nodes:
        p.wait(timeout=5)
    if in_sessions(sessions):
        print(
            f"ray_nodes: processes still running after SIGKILL: {in_sessions(sessions)} ({left})",
            file=sys.stderr,
        )


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_command(command: list[str], env: dict[str, str]) -> int:
    """COMMAND's exit status. Interrupted, it is asked to stop first (SIGTERM: a pytest session of the
    plugin stops its workers and leaves with exit 2), and killed after COMMAND_GRACE_S."""
    child = subprocess.Popen(command, env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=COMMAND_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nodes", type=int, help="how many Ray nodes to start on this host")
    ap.add_argument(
        "--logs", type=Path, default=None, help="folder for each node's log (default: a temporary one)"
    )
    argv = sys.argv[1:] if argv is None else argv
    ours, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = ap.parse_args(ours)
    if args.nodes < 1 or not command:
        ap.error("give N >= 1 and a command after --")
    gpus = gpu_count()
    if gpus and args.nodes > gpus:
        ap.error(f"{args.nodes} nodes of one GPU each asked for; this host has {gpus} GPU(s)")
    cpus = max(1, (os.cpu_count() or 1) // args.nodes)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="ray-nodes-"))
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    nodes: list[subprocess.Popen] = []
    # Each node on the host's own address: `ray start` turns 127.0.0.1 into it, and refuses to join a
    # node under RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (what keeps an embedded Ray on 127.0.0.1). A token of
    # this cluster's own for every node and driver: Ray turns token authentication on wherever
    # ~/.ray/auth_token exists (an embedded Ray writes one), and a driver without it is refused.
    cluster_env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    cluster_env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    os.environ.update(cluster_env)  # wait_for_nodes's driver too
    signal.signal(signal.SIGTERM, _interrupted)  # as Ctrl-C: the finally below stops the nodes either way
    try:
        for i in range(args.nodes):
            env = cluster_env.copy()
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(i)
            with open(logs / f"node{i}.log", "w") as log:
                cmd = node_command(i, port, cpus, 1 if gpus else 0)
                nodes.append(
                    subprocess.Popen(
                        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
            if i == 0:
                wait_for_nodes(port, 1, nodes, logs)
        address = wait_for_nodes(port, args.nodes, nodes, logs)
        print(
            f"ray_nodes: {args.nodes} node(s) at {address} ({gpus and 1} GPU, {cpus} CPUs each); logs in {logs}",
            flush=True,
        )
        return run_command(command, cluster_env | {"RAY_ADDRESS": address})
    except SystemExit as exc:
        print(exc.code, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        stop_nodes(nodes)


if __name__ == "__main__":
    sys.exit(main())
