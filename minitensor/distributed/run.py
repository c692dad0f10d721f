"""`python -m minitensor.distributed.run`: torchrun's launcher for one node (or a fixed set of nodes).

    python -m minitensor.distributed.run --nproc-per-node 2 train.py --lr 0.1
    python -m minitensor.distributed.run --nproc-per-node 2 -m package.train

Starts `--nproc-per-node` fresh interpreters (`python -u`, as torchrun: a new process, never a fork of one
that holds a device), each in a session (so a process group) of its own with torchrun's variables: MASTER_ADDR,
MASTER_PORT (a free port unless given), WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, and OMP_NUM_THREADS=1 when unset and there is more than one process.

The ranks' output passes through as it comes, newline or not (a progress bar's `\\r` steps show at once; only
the end of a line still being written waits, 0.1 s at most, for its rest, so that the ranks' lines stay whole);
the last 64 KiB of each is kept for the failure report. It fails fast, as torchrun: when a rank exits
non-zero (a thread per rank sees it end at once), every rank's process group gets SIGTERM, an ended rank's too
(what it started, data-loader workers or a server, ends with it), and SIGKILL after `--shutdown-timeout`
seconds for what is left. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher stop them the same way,
with that signal. A process the ranks started that outlives its parent comes to the launcher (a child
subreaper), which stops it at once, SIGTERM then SIGKILL (run_children.py). The report names the first rank
seen to fail, its exit code (-N for signal N) and its last lines. The exit code is torchrun's: 0 when every
rank exits 0, else 1. Where mpi4py and MPICH's wheel are installed, each rank is an MPI job of one (`mpiexec -n
1 python ...`, see `--mpiexec`), so that the MPI backend can join the ranks: mpiexec forwards signals and
passes exit codes through.
"""
import argparse
import datetime
import importlib.util
import os
import queue
import secrets
import signal
import socket
import sys

from .run_children import TAIL_LINES, Leftovers, Rank, become_subreaper, settle, stop

_SWEEP_S = 0.05  # how often the launcher looks for leftovers (run_children.py)
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


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


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        return f"signal {signum}"


def _report(rank, name):
    """torchrun's failure summary of the first rank seen to fail, with its last lines instead of an error file."""
    code = rank.exit_code
    how = f" ({_signal_name(-code)})" if code < 0 else ""
    when = datetime.datetime.fromtimestamp(rank.ended_at).isoformat(sep="_", timespec="milliseconds")
    border, title = "=" * 60, f"{name} FAILED"
    print("\n".join([border, title, "-" * 60, "Root Cause (first observed failure):", f"  time      : {when}",
                     f"  rank      : {rank.rank} (local_rank: {rank.local_rank})",
                     f"  exitcode  : {code} (pid: {rank.process.pid}){how}",
                     f"  last output (up to {TAIL_LINES} lines):", *(f"    {line}" for line in rank.tail.lines()),
                     border]), file=sys.stderr, flush=True)


def _supervise(ranks, events, args):
    """The launcher's exit code, torchrun's: 0 once every rank has exited 0; 1 once one has failed (reported)
    or the launcher got a signal, after stopping every rank's process group. `events` has the ranks' ends and
    the signals in the order they came; between them, leftovers are stopped as they come."""
    leftovers = Leftovers(ranks)
    running = set(ranks)
    while running:
        leftovers.sweep(args.shutdown_timeout)
        try:
            event = events.get(timeout=_SWEEP_S)
        except queue.Empty:
            continue
        if isinstance(event, int):  # a signal
            stop(ranks, leftovers, event, args.shutdown_timeout)
            print(f"python -m minitensor.distributed.run: got {_signal_name(event)}, stopped the processes",
                  file=sys.stderr, flush=True)
            return 1
        running.discard(event)
        if event.exit_code != 0:
            stop(ranks, leftovers, signal.SIGTERM, args.shutdown_timeout)
            _report(event, args.training_script)
            return 1
    settle(ranks, leftovers, args.shutdown_timeout)
    return 0


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
    # the job token rank 0's TCPStore requires of its peers: a random one for a job on one node; the nodes of a
    # larger job share the one their launchers are given in MINITENSOR_JOB_TOKEN (else there is none)
    token = os.environ.get("MINITENSOR_JOB_TOKEN") or (secrets.token_hex(16) if args.nnodes == 1 else "")
    become_subreaper()
    events = queue.SimpleQueue()  # the ranks' ends and the launcher's signals (put is reentrant)
    for signum in _FORWARDED:
        signal.signal(signum, lambda number, frame: events.put(number))
    ranks = []
    try:
        for local_rank in range(args.nproc_per_node):
            rank = args.node_rank * args.nproc_per_node + local_rank
            env = dict(_environment(args, port, local_rank), MINITENSOR_JOB_TOKEN=token)
            ranks.append(Rank(command, env, rank, local_rank, events))
    except BaseException:  # e.g. the interpreter could not start: stop those already running
        stop(ranks, Leftovers(ranks), signal.SIGTERM, args.shutdown_timeout)
        raise
    return _supervise(ranks, events, args)


if __name__ == "__main__":
    sys.exit(main())
