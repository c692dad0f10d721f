"""`python -m minitensor.distributed.run`: torchrun's launcher for one node (or a fixed set of nodes).

    python -m minitensor.distributed.run --nproc-per-node 2 train.py --lr 0.1
    python -m minitensor.distributed.run --nproc-per-node 2 -m package.train

Starts `--nproc-per-node` fresh interpreters (`python -u`, as torchrun: a new process, never a fork of one
that holds a device), each in a session of its own with torchrun's variables: MASTER_ADDR, MASTER_PORT (a free
port unless given), WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, and
OMP_NUM_THREADS=1 when unset and there is more than one process. The children's output is echoed as it comes,
keeping each one's last lines. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every child. It fails
fast: when a child exits non-zero the others get SIGTERM (SIGKILL after `--shutdown-timeout` seconds), the
failing rank, its exit code and its last lines are reported, and the launcher exits with that child's code
(128 + N for a child killed by signal N). It exits 0 when every child does. Where mpi4py and MPICH's wheel are
installed, each child is an MPI job of one (`mpiexec -n 1 python ...`, see `--mpiexec`), so that the MPI
backend can join the ranks; mpiexec forwards signals and passes exit codes through.
"""
import argparse
import collections
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time

_TAIL_LINES = 20
_POLL_S = 0.05
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_echo_lock = threading.Lock()  # one line at a time on the launcher's output, whichever child wrote it


def _parser():
    parser = argparse.ArgumentParser(prog="python -m minitensor.distributed.run",
                                     description="Starts one process per rank with torchrun's variables.")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                        help="processes on this node (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes, each running this launcher (default 1)")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's index (default 0)")
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1",
                        help="the address of rank 0's node (default 127.0.0.1)")
    parser.add_argument("--master-port", "--master_port", type=int,
                        help="rank 0's store port (default: a free port; required with --nnodes > 1)")
    parser.add_argument("--shutdown-timeout", "--shutdown_timeout", type=float, default=30.0,
                        help="seconds between SIGTERM and SIGKILL when stopping the processes (default 30)")
    parser.add_argument("--mpiexec", choices=("auto", "always", "never"), default="auto",
                        help="start each process as an MPI job of one (`mpiexec -n 1`), so the MPI backend can "
                             "join them; auto: when mpi4py and the mpiexec beside this interpreter are installed")
    parser.add_argument("-m", "--module", action="store_true", help="run training_script as `python -m` does")
    parser.add_argument("training_script", help="the script (or with -m the module) each process runs")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def _parse(argv):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1 or args.nnodes < 1:
        parser.error(f"--nproc-per-node and --nnodes must be at least 1, got {args.nproc_per_node} and {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in [0, {args.nnodes}), got {args.node_rank}")
    if args.nnodes > 1 and args.master_port is None:
        parser.error("--master-port is required with --nnodes > 1: every node must name the same port")
    if args.master_port is not None and not 0 < args.master_port < 2**16:
        parser.error(f"--master-port must be in [1, 65535], got {args.master_port}")
    return args


def _free_port():
    """A port free now. Another process could take it before rank 0 listens, as with torchrun's choice."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _environment(args, port, local_rank):
    nproc = args.nproc_per_node
    env = dict(os.environ)
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default: N processes x all cores each overload a node
    env.update(MASTER_ADDR=args.master_addr, MASTER_PORT=str(port), WORLD_SIZE=str(nproc * args.nnodes),
               RANK=str(args.node_rank * nproc + local_rank), LOCAL_RANK=str(local_rank),
               LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK=str(args.node_rank), GROUP_WORLD_SIZE=str(args.nnodes))
    return env


class _Worker:
    """One child process: its ranks, and the last lines it wrote (stdout and stderr), echoed as they come."""

    def __init__(self, command, env, rank, local_rank):
        self.rank, self.local_rank = rank, local_rank
        self.tail = collections.deque(maxlen=_TAIL_LINES)
        # a session of its own: a terminal's Ctrl-C reaches the launcher once, which forwards it once, and
        # stopping the process group also stops what the child started
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        self._readers = [threading.Thread(target=self._echo, args=(pipe, out), daemon=True)
                         for pipe, out in ((self.process.stdout, sys.stdout), (self.process.stderr, sys.stderr))]
        for reader in self._readers:
            reader.start()

    def _echo(self, pipe, out):
        for line in iter(pipe.readline, b""):
            self.tail.append(line)
            with _echo_lock:
                out.buffer.write(line)
                out.buffer.flush()
        pipe.close()

    def signal(self, signum):
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:  # the child and everything it started are gone
            pass

    def finish_echo(self, timeout_s=1.0):
        """Waits for the rest of the child's output, unless something it started holds the pipe open."""
        for reader in self._readers:
            reader.join(timeout_s)


def _stop(workers, signum, shutdown_timeout):
    """Sends `signum` to every running child, SIGKILL to those alive after `shutdown_timeout` seconds."""
    running = [worker for worker in workers if worker.process.poll() is None]
    for worker in running:
        worker.signal(signum)
    deadline = time.monotonic() + shutdown_timeout
    for worker in running:
        try:
            worker.process.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            worker.signal(signal.SIGKILL)
            worker.process.wait()
    for worker in workers:
        worker.finish_echo()


def _exit_code(returncode):
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        return f"signal {signum}"


def _report(worker, name):
    """torchrun's failure summary, with the failing child's last lines instead of an error file."""
    code = worker.process.returncode
    how = f" ({_signal_name(-code)})" if code < 0 else ""
    lines = [line.decode(errors="replace").rstrip("\n") for line in worker.tail]
    border, title = "=" * 60, f"{name} FAILED"
    print("\n".join([border, title, "-" * 60, "Root Cause (first observed failure):",
                     f"  rank      : {worker.rank} (local_rank: {worker.local_rank})",
                     f"  exitcode  : {code} (pid: {worker.process.pid}){how}",
                     f"  last output (up to {_TAIL_LINES} lines):", *(f"    {line}" for line in lines), border]),
          file=sys.stderr, flush=True)


def _supervise(workers, received, args):
    """The launcher's exit code, once every child has succeeded, one has failed, or a signal came."""
    while True:
        if received:
            _stop(workers, received[0], args.shutdown_timeout)
            return 128 + received[0]
        failed = [worker for worker in workers if worker.process.poll() not in (None, 0)]
        if failed:
            _stop(workers, signal.SIGTERM, args.shutdown_timeout)
            _report(failed[0], args.training_script)
            return _exit_code(failed[0].process.returncode)
        if all(worker.process.returncode == 0 for worker in workers):
            for worker in workers:
                worker.finish_echo()
            return 0
        time.sleep(_POLL_S)


def _mpi_prefix(choice):
    """`mpiexec -n 1` (MPICH's, beside this interpreter, as its wheel installs it) when the processes should be MPI
    jobs: MPICH up to 5.0.2 gives every process that no process manager started the same identity, so such
    processes can never join one communicator (minitensor/distributed/mpi_world.py)."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = os.access(mpiexec, os.X_OK)
    if choice == "always" and not found:
        raise SystemExit(f"--mpiexec always: no mpiexec at {mpiexec} (pip install 'minitensor[mpi]')")
    wanted = choice == "always" or (choice == "auto" and found and importlib.util.find_spec("mpi4py") is not None)
    return [mpiexec, "-n", "1"] if wanted else []


def main(argv=None):
    args = _parse(argv)
    command = [*_mpi_prefix(args.mpiexec), sys.executable, "-u", *(["-m"] if args.module else []),
               args.training_script, *args.training_script_args]
    port = args.master_port or _free_port()
    received = []
    for signum in _FORWARDED:
        signal.signal(signum, lambda number, frame: received.append(number))
    workers = []
    try:
        for local_rank in range(args.nproc_per_node):
            rank = args.node_rank * args.nproc_per_node + local_rank
            workers.append(_Worker(command, _environment(args, port, local_rank), rank, local_rank))
    except BaseException:  # e.g. the interpreter could not start: stop those already running
        _stop(workers, signal.SIGTERM, args.shutdown_timeout)
        raise
    return _supervise(workers, received, args)


if __name__ == "__main__":
    sys.exit(main())
