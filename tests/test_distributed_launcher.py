"""`python -m minitensor.distributed.run`: the variables each rank sees, rendezvous through env://, `-m`, fail
fast naming the first rank to fail with its code and last lines, stopping what the ranks started too, signals,
and output passed through as it comes. Every launch has a hard timeout."""
import importlib.util
import json
import os
import select
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
    """Whether process `pid` ends within `timeout` seconds; a zombie has ended (only its parent's wait is left,
    and an orphan's parent, init in a container, may never wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as file:
                if file.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def kill_all(pids):
    """Cleans up after a failed test: what the launcher should have ended must not outlive it."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)


def read_until(pipe, wanted, timeout=30):
    """What came on `pipe` up to and including `wanted`, read as it comes (the writer is still running)."""
    data, deadline = b"", time.monotonic() + timeout
    while wanted not in data:
        ready, _, _ = select.select([pipe], [], [], max(deadline - time.monotonic(), 0))
        assert ready, f"{wanted!r} did not come through within {timeout} s; got {data!r}"
        chunk = os.read(pipe.fileno(), 65536)
        assert chunk, f"the pipe closed before {wanted!r} came; got {data!r}"
        data += chunk
    return data


def peak_rss(pid):
    """Process `pid`'s peak resident memory in bytes (VmHWM)."""
    with open(f"/proc/{pid}/status") as file:
        return next(int(line.split()[1]) * 1024 for line in file if line.startswith("VmHWM:"))


def mpiexec_modes():
    """Ranks as plain processes, and as MPI jobs of one where mpi4py is installed."""
    return ["never", pytest.param("always", marks=pytest.mark.skipif(
        importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed"))]


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
    """Rank 1 exits 3 once all four run: the launcher exits 1 (torchrun's), names rank 1 with its 3 and shows its
    last lines, and the sleeping ranks are gone; rank 0, which ignores SIGTERM in the second case, is killed
    after the timeout."""
    args = ["--nproc-per-node", 4, "--shutdown-timeout", 1, os.path.join(SCRIPTS, "launcher_fail.py"), tmp_path,
            1, 3, *(["ignore-sigterm"] if ignore_sigterm else [])]
    began = time.monotonic()
    done = launch(*args, timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 1, done.stderr
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
        _, err = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == 1  # torchrun's, as for a failed rank
    assert "got SIGTERM, stopped the processes" in err
    assert all(gone(pid) for pid in pids)


def test_exit_codes(tmp_path):
    """0 when every rank exits 0; 1 when a rank dies of signal N, which the report names with -N."""
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    assert launch("--nproc-per-node", 2, "-m", "json.tool", "--help").returncode == 0
    done = launch("--nproc-per-node", 2, "--mpiexec", "never", script)  # mpiexec reports a killed child as 9
    assert done.returncode == 1
    assert "exitcode  : -9" in done.stderr and "(SIGKILL)" in done.stderr


def test_ranks_run_as_mpi_jobs_of_one_when_asked(tmp_path):
    """--mpiexec always: each rank is `mpiexec -n 1 python ...` (MPICH's process manager sets PMI_SIZE), the
    launcher's variables pass through, and so does an exit code, to the report; never: plain processes."""
    pytest.importorskip("mpi4py")
    script = tmp_path / "mpi_job.py"
    script.write_text("import os, sys, time\nprint('RESULT', os.environ.get('PMI_SIZE'), os.environ['RANK'])\n"
                      "if os.environ['RANK'] == '1':\n    time.sleep(1)\n    sys.exit(3)\n")  # rank 0 ends first
    done = launch("--nproc-per-node", 2, "--mpiexec", "always", script)
    assert done.returncode == 1 and "exitcode  : 3 (pid: " in done.stderr
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("RESULT")) == ["RESULT 1 0",
                                                                                              "RESULT 1 1"]
    plain = launch("--nproc-per-node", 1, "--mpiexec", "never", script)
    assert plain.returncode == 0 and "RESULT None 0" in plain.stdout


@pytest.mark.parametrize("mpiexec", mpiexec_modes())
def test_what_the_ranks_started_ends_with_them(tmp_path, mpiexec):
    """Rank 1 exits 3 once both ranks have started two children that ignore SIGTERM, one in the rank's process
    group and one in a session of its own: when the launcher returns, they are gone too, the failed rank's as
    well as the stopped one's, killed after the timeout. Those out of reach of the rank's group (the second, and
    under mpiexec, whose Hydra puts the rank in a session of its own and waits for a child that holds the output
    it inherited, both) come to the launcher, a child subreaper, when their parent ends."""
    args = ["--nproc-per-node", 2, "--mpiexec", mpiexec, "--shutdown-timeout", 1,
            os.path.join(SCRIPTS, "launcher_children.py"), tmp_path, 1]
    try:
        done = launch(*args, timeout=60)
        assert done.returncode == 1 and "exitcode  : 3 (pid: " in done.stderr, done.stderr
        pids = [int(pid) for path in tmp_path.glob("*.pid") for pid in path.read_text().split()]
        assert len(pids) == 6 and [pid for pid in pids if not gone(pid, timeout=5)] == []
    finally:
        kill_all(int(pid) for path in tmp_path.glob("*.pid") for pid in path.read_text().split())


@pytest.mark.parametrize("mpiexec", mpiexec_modes())
def test_the_report_names_the_first_rank_to_fail(tmp_path, mpiexec):
    """Rank 1 exits 7 and rank 0 exits 1 about 30 ms after (as an MPI rank whose peer's end broke a collective):
    the root cause is rank 1 with 7, and the launcher exits 1 as torchrun does. Three rounds: a launcher that looks
    at its children every 50 ms and takes the lowest rank of those it finds failed names rank 0 most times."""
    for attempt in range(3):
        pid_dir = tmp_path / str(attempt)
        pid_dir.mkdir()
        done = launch("--nproc-per-node", 2, "--mpiexec", mpiexec,
                      os.path.join(SCRIPTS, "launcher_first_failure.py"), pid_dir, timeout=60)
        assert done.returncode == 1, done.stderr
        root = done.stderr[done.stderr.index("Root Cause (first observed failure):"):]
        assert "rank      : 1 (local_rank: 1)" in root and "exitcode  : 7 (pid: " in root, done.stderr


@pytest.mark.parametrize("mpiexec", mpiexec_modes())
def test_output_passes_through_as_it_comes(tmp_path, mpiexec):
    """A progress bar's `\\r`-separated steps, with no newline yet, reach the launcher's stdout and stderr while
    the rank still runs; the failure report shows its last line as a terminal does: the last step."""
    launcher = subprocess.Popen([*LAUNCHER, "--nproc-per-node", "1", "--mpiexec", mpiexec,
                                 os.path.join(SCRIPTS, "launcher_progress.py"), str(tmp_path)], cwd=REPO,
                                env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out = read_until(launcher.stdout, b"step 2/3\r")
        err = read_until(launcher.stderr, b"loading 50%\r")
        (tmp_path / "go").touch()
        rest_out, rest_err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert out + rest_out == b"step 1/3\rstep 2/3\r\rstep 3/3 done" and err == b"loading 50%\r"
    assert launcher.returncode == 1
    report = rest_err.decode()
    assert "exitcode  : 4 (pid: " in report
    assert report[report.index("last output"):].splitlines()[1:-1] == ["    step 3/3 done"]


def test_lines_written_in_two_pieces_stay_whole(tmp_path):
    """Two ranks print at once, each line in two writes a millisecond apart (the text, then the newline, as
    print does): passing output through as it comes must not cut one rank's line with the other's."""
    script = tmp_path / "lines.py"
    script.write_text("import os, sys, time\nfor i in range(100):\n"
                      "    sys.stdout.write(f\"rank {os.environ['RANK']} line {i} {'x' * 60}\")\n"
                      "    time.sleep(0.001)\n    sys.stdout.write('\\n')\n")
    done = launch("--nproc-per-node", 2, "--mpiexec", "never", script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines) == sorted(f"rank {rank} line {i} {'x' * 60}" for rank in range(2) for i in range(100))


def test_output_without_newlines_keeps_the_launcher_small(tmp_path):
    """A rank writes 128 MiB without a newline: the launcher passes it through in pieces and keeps only the last
    64 KiB for the report, so its peak memory grows by far less than that (a line-by-line echo holds it all)."""
    launcher = subprocess.Popen([*LAUNCHER, "--nproc-per-node", "1", "--mpiexec", "never",
                                 os.path.join(SCRIPTS, "launcher_flood.py"), str(tmp_path), "128"], cwd=REPO,
                                env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(tmp_path / "ready")
        before = peak_rss(launcher.pid)
        (tmp_path / "go").touch()
        wait_for(tmp_path / "written")
        grown = peak_rss(launcher.pid) - before
        (tmp_path / "done").touch()
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    assert grown < 32 * 2**20, f"the launcher grew by {grown / 2**20:.0f} MiB passing 128 MiB through"


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
