"""`python -m minitensor.distributed.run`: the variables each rank sees, rendezvous through env://, `-m`, fail
fast with the failing rank's code and last lines, and signals. Every launch has a hard timeout."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "distributed_scripts")
LAUNCHER = [sys.executable, "-m", "minitensor.distributed.run"]


def environment():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, SCRIPTS, os.environ.get("PYTHONPATH", "")]))


def launch(*args, timeout=120):
    return subprocess.run([*LAUNCHER, *map(str, args)], cwd=REPO, env=environment(), capture_output=True,
                          text=True, timeout=timeout)


def start(*args):
    return subprocess.Popen([*LAUNCHER, *map(str, args)], cwd=REPO, env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def results(done):
    assert done.returncode == 0, done.stderr
    found = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(found, key=lambda result: result["rank"])


def pids_when_all_started(pid_dir, count, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [name for name in os.listdir(pid_dir) if name.endswith(".pid")]
        if len(names) == count:
            return [int(open(os.path.join(pid_dir, name)).read()) for name in names]
        time.sleep(0.05)
    raise AssertionError(f"only {len(names)} of {count} ranks started")


def gone(pid, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("nproc", [2, 4])
def test_each_rank_sees_its_variables_and_meets_the_others(nproc):
    done = launch("--nproc-per-node", nproc, os.path.join(SCRIPTS, "launcher_ranks.py"), "--lr", "0.1")
    found = results(done)
    assert [r["rank"] for r in found] == list(range(nproc))
    ports = {r["env"]["MASTER_PORT"] for r in found}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for r in found:
        rank = str(r["rank"])
        assert r["env"] == {"RANK": rank, "WORLD_SIZE": str(nproc), "LOCAL_RANK": rank,
                            "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": r["env"]["MASTER_PORT"], "GROUP_RANK": "0"}
        assert r["world_size"] == nproc and r["argv"] == ["--lr", "0.1"] and r["main"] == "__main__"
        assert r["seen"] == [f"from rank {other}" for other in range(nproc)]
    assert sorted(r["arrived"] for r in found) == list(range(1, nproc + 1))  # every add counted once


def test_module_form():
    found = results(launch("--nproc_per_node", 2, "-m", "launcher_ranks", "x"))
    assert [r["rank"] for r in found] == [0, 1]
    assert all(r["main"] == "__main__" and r["argv"] == ["x"] for r in found)


def test_two_nodes_meet_on_the_given_port():
    port = free_port()
    nodes = [start("--nnodes", 2, "--node-rank", node, "--nproc-per-node", 1, "--master-port", port,
                   os.path.join(SCRIPTS, "launcher_ranks.py")) for node in (1, 0)]
    outputs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err for out, err in outputs]
    found = [r for out, err in outputs for r in results(subprocess.CompletedProcess([], 0, out, err))]
    by_rank = {r["rank"]: r for r in found}
    assert by_rank[1]["env"]["GROUP_RANK"] == "1" and by_rank[1]["env"]["LOCAL_RANK"] == "0"
    assert all(r["env"]["WORLD_SIZE"] == "2" and r["env"]["MASTER_PORT"] == str(port) for r in found)
    assert all(r["seen"] == ["from rank 0", "from rank 1"] for r in found)


@pytest.mark.parametrize("ignore_sigterm", [False, True])
def test_a_failing_rank_stops_the_others(tmp_path, ignore_sigterm):
    """Rank 1 exits 3 once all four run: the launcher exits 3, names rank 1 and shows its last lines, and the
    sleeping ranks are gone; rank 0, which ignores SIGTERM in the second case, is killed after the timeout."""
    args = ["--nproc-per-node", 4, "--shutdown-timeout", 1, os.path.join(SCRIPTS, "launcher_fail.py"), tmp_path,
            1, 3, *(["ignore-sigterm"] if ignore_sigterm else [])]
    began = time.monotonic()
    done = launch(*args, timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 3, done.stderr
    assert took < 30
    report = done.stderr[done.stderr.index("launcher_fail.py FAILED"):]
    assert "rank      : 1 (local_rank: 1)" in report and "exitcode  : 3 (pid: " in report
    tail = report[report.index("last output"):].splitlines()[1:-1]
    assert len(tail) == 20 and tail[-1].strip() in ("rank 1 fails with 3", "rank 1 line 24")
    assert "rank 1 line 24" in report and "rank 1 line 4\n" not in report  # only the last 20 lines
    assert "rank 1 line 0" in done.stdout  # and the whole output was echoed as it came
    pids = [int((tmp_path / f"{rank}.pid").read_text()) for rank in range(4)]
    assert all(gone(pid) for pid in pids)


def test_sigterm_to_the_launcher_stops_every_rank(tmp_path):
    launcher = start("--nproc-per-node", 2, os.path.join(SCRIPTS, "launcher_fail.py"), tmp_path, -1, 0)
    try:
        pids = pids_when_all_started(tmp_path, 2)
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM
    assert all(gone(pid) for pid in pids)


def test_exit_codes(tmp_path):
    """0 when every rank exits 0; 128 + N when a rank dies of signal N, which the report names."""
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    assert launch("--nproc-per-node", 2, "-m", "json.tool", "--help").returncode == 0
    done = launch("--nproc-per-node", 2, "--mpiexec", "never", script)  # mpiexec reports a killed child as 9
    assert done.returncode == 128 + signal.SIGKILL
    assert "exitcode  : -9" in done.stderr and "(SIGKILL)" in done.stderr


def test_ranks_run_as_mpi_jobs_of_one_when_asked(tmp_path):
    """--mpiexec always: each rank is `mpiexec -n 1 python ...` (MPICH's process manager sets PMI_SIZE), the
    launcher's variables pass through, and so does an exit code; never: plain processes."""
    pytest.importorskip("mpi4py")
    script = tmp_path / "mpi_job.py"
    script.write_text("import os, sys, time\nprint('RESULT', os.environ.get('PMI_SIZE'), os.environ['RANK'])\n"
                      "if os.environ['RANK'] == '1':\n    time.sleep(1)\n    sys.exit(3)\n")  # rank 0 ends first
    done = launch("--nproc-per-node", 2, "--mpiexec", "always", script)
    assert done.returncode == 3
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("RESULT")) == ["RESULT 1 0",
                                                                                              "RESULT 1 1"]
    plain = launch("--nproc-per-node", 1, "--mpiexec", "never", script)
    assert plain.returncode == 0 and "RESULT None 0" in plain.stdout


@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", 0, "x.py"], "--nproc-per-node and --nnodes must be at least 1, got 0 and 1"),
    (["--nnodes", 2, "x.py"], "--master-port is required with --nnodes > 1"),
    (["--nnodes", 2, "--node-rank", 2, "--master-port", 5, "x.py"], "--node-rank must be in [0, 2), got 2"),
    (["--master-port", 70000, "x.py"], "--master-port must be in [1, 65535], got 70000"),
])
def test_bad_arguments(args, message):
    done = launch(*args, timeout=30)
    assert done.returncode == 2 and message in done.stderr


def free_port():
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
