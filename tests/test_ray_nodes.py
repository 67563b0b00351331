"""benchmarks/ray_nodes.py: a command runs against N real Ray nodes started on this host (``ray start``),
gets its own exit status back, and nothing the nodes started outlives the script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from trainer.driver.ray_processes import in_sessions

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ray_nodes.py"

# Run against the cluster: what it sees, then an exit status of its own, which the script must return.
PROBE = """
import json, os, sys, ray
ray.init(log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]
# the nodes' `ray start` processes: the script's other children, each leading a session of its own
starts = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and os.path.exists(f"/proc/{p}/cmdline")
          and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getppid())
          and b"ray.scripts.scripts" in open(f"/proc/{p}/cmdline", "rb").read()]
print(json.dumps({"address": os.environ["RAY_ADDRESS"], "nodes": len(alive), "sessions": starts}))
ray.shutdown()
sys.exit(3)
"""


def processes_holding(needle: str) -> list[int]:
    """The pids of this user's processes whose environment holds ``needle`` (zombies hold none)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle.encode() in fh.read():
                    found.append(int(entry))
        except OSError:  # gone, or not ours
            pass
    return found


def test_a_command_runs_on_two_nodes_keeps_its_exit_status_and_leaves_no_process(tmp_path):
    # every process the nodes start inherits this (Ray's agents do not get the cluster's token)
    mark = f"RAY_NODES_TEST_MARK={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    env["RAY_NODES_TEST_MARK"] = mark.split("=", 1)[1]
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--logs",
            str(tmp_path / "logs"),
            "2",
            "--",
            sys.executable,
            "-c",
            PROBE,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    logs = {p.name: p.read_text()[-2000:] for p in (tmp_path / "logs").glob("*.log")}
    assert done.returncode == 3, (done.returncode, done.stdout[-2000:], done.stderr[-3000:], logs)
    seen = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert seen["nodes"] == 2, seen
    assert sorted(logs) == ["node0.log", "node1.log"]
    assert len(seen["sessions"]) == 2, seen
    # Ray's workers and agents overwrite their environment with their title (setproctitle): the
    # nodes' sessions find those, the mark the others
    assert in_sessions(set(seen["sessions"])) == [], f"still running after the script: {seen}"
    assert processes_holding(mark) == [], f"still running after the script: {seen}"


def test_usage_errors_start_nothing():
    for args in (["0", "--", "true"], ["2"]):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert "give N >= 1 and a command after --" in done.stderr, done.stderr


def test_a_sigterm_stops_the_command_and_every_node(tmp_path):
    """SIGTERM while the command runs: the command is asked to stop, then every node's processes end.
    (A driver's ray.init in the script's own process had taken over SIGTERM: the script then died at
    once and left the nodes and the command running.)"""
    pid_file = tmp_path / "command.pid"
    command = [
        sys.executable,
        "-c",
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    script = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--logs", str(tmp_path / "logs"), "1", "--", *command],  # one node: CI's time
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        for _ in range(1200):  # the nodes up and the command started: up to 2 minutes
            if pid_file.exists() and pid_file.read_text():
                break
            assert script.poll() is None, script.stdout.read() if script.stdout else ""
            time.sleep(0.1)
        sessions = {
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and b"ray.scripts.scripts" in Path(f"/proc/{p}/cmdline").read_bytes()
            and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(script.pid)
        }  # fmt: skip
        assert len(sessions) == 1, sessions
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=120) == 130, script.stdout.read() if script.stdout else ""
    finally:
        if script.poll() is None:
            script.kill()
    assert in_sessions(sessions) == [], "nodes still running after SIGTERM"
    assert (
        not Path(f"/proc/{pid_file.read_text()}").exists()
        or Path(f"/proc/{pid_file.read_text()}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    ), "the command still runs after SIGTERM"
