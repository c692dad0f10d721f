#!/usr/bin/env bash
# One command for a GPU machine, run from the repo root: install, run the tests on the real GPU,
# then the benchmark (and bench.matmul's table against cuBLAS, bench.distributed's all_reduce against nccl4py and
# torch.distributed on every GPU), and end with a short summary.
# A test failure is reported; the bench still runs.
# Logs and bench.json go to $OUT (the device tool's output folder), or to a temporary folder.
#   STAGES  which of "tests bench hostcalls" to run (default all three); hostcalls: the host calls of the hot ops
#           against tests/budgets/nvidia.json (a candidate budget in $OUT/nvidia.json, see tests/host_calls.py),
#           their tests and bench.breakdown's table
#   TESTS   narrows the test run (default: tests)
#   TEST_TIMEOUT_S  one test's limit (pytest-timeout), PYTEST_TIMEOUT_S the whole parallel run's
#   WORKERS pytest-xdist processes (default 12 when xdist is installed): a cold machine compiles every
#           kernel, and parallel workers compile in parallel. Files that take most of the GPU's memory
#           (SERIAL_TESTS) run alone afterwards, so workers never see each other's allocations.
#   MINITENSOR_CACHE_DIR  compiled kernels; pass a folder in the repo to reuse it across calls.
set -u
export PYTHONUNBUFFERED=1
export MINITENSOR_BACKEND=nvidia
PY="${PYTHON:-python3}"  # the GPU image's python3 is the one with torch and CuPy
OUT="${OUT:-$(mktemp -d)}"
STAGES="${STAGES:-tests bench hostcalls}"
SERIAL_TESTS="tests/test_memory_api.py tests/test_expandable_segments.py"  # out-of-memory cases fill the GPU
mkdir -p "$OUT"
export MINITENSOR_EXIT_WATCHDOG="${MINITENSOR_EXIT_WATCHDOG:-$OUT/exit_hang.log}"  # see tests/conftest.py

"$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1
pip_rc=$?
# the distributed extras (nccl4py, mpi4py, mpich) the GPU image lacks: wheels carried in wheels/ (gitignored;
# `pip download --no-deps --python-version 3.12 --only-binary=:all: -d wheels nccl4py mpi4py mpich` fills it)
if compgen -G "wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-deps wheels/*.whl >>"$OUT/pip.log" 2>&1 || pip_rc=$?
fi
pytest_rc=skipped
serial_rc=skipped
bench_rc=skipped
hostcalls_rc=skipped

if [[ " $STAGES " == *" tests "* ]]; then
    plugins=()
    if "$PY" -c "import xdist" 2>/dev/null; then plugins+=(-n "${WORKERS:-12}"); fi
    # A stuck test fails with its stack after TEST_TIMEOUT_S instead of stalling the whole run.
    if "$PY" -c "import pytest_timeout" 2>/dev/null; then plugins+=(--timeout "${TEST_TIMEOUT_S:-200}"); fi
    # A hung run must not eat the bench's time: the device tool stops a command after 10 minutes.
    timeout "${PYTEST_TIMEOUT_S:-420}" "$PY" -m pytest -v -rfE -p no:cacheprovider "${plugins[@]}" \
        --durations=25 $(for f in $SERIAL_TESTS; do echo "--ignore=$f"; done) ${TESTS:-tests} \
        >"$OUT/pytest.log" 2>&1
    pytest_rc=$?
    if [ -z "${TESTS:-}" ]; then
        timeout 120 "$PY" -m pytest -q -rfE -p no:cacheprovider $SERIAL_TESTS >"$OUT/pytest_serial.log" 2>&1
        serial_rc=$?
    fi
    grep -E "^(FAILED|ERROR)" "$OUT"/pytest*.log | head -40
fi

if [[ " $STAGES " == *" bench "* ]]; then
    rm -f "$OUT/bench.json"
    "$PY" -m bench --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
    bench_rc=$?
    timeout 200 "$PY" -m bench.matmul >"$OUT/bench_matmul.log" 2>&1 || bench_rc="$bench_rc, matmul failed"
    # all_reduce against nccl4py and torch.distributed, one rank per GPU (NCCL allows one rank a GPU)
    gpus=$("$PY" -c "import minitensor as mt; print(mt.cuda.device_count())")
    timeout 200 "$PY" -m minitensor.distributed.run --nproc-per-node "$gpus" -m bench.distributed \
        >"$OUT/bench_distributed.log" 2>&1 || bench_rc="$bench_rc, distributed failed"
fi

if [[ " $STAGES " == *" hostcalls "* ]]; then
    # counts in a fresh process each (cuda-bindings wrapped before minitensor imports it): no timing involved
    timeout 300 "$PY" tests/host_calls.py --detail --json "$OUT/host_calls.json" --write "$OUT/nvidia.json" \
        >"$OUT/host_calls.log" 2>&1
    hostcalls_rc=$?
    timeout 300 "$PY" -m pytest -q -rfEw -p no:cacheprovider tests/test_host_budget.py tests/test_bench_tools.py \
        >>"$OUT/host_calls.log" 2>&1 || hostcalls_rc="$hostcalls_rc, tests failed"
    timeout 200 "$PY" -m bench.breakdown >"$OUT/breakdown.log" 2>&1 || hostcalls_rc="$hostcalls_rc, breakdown failed"
fi

echo
echo "== gpu_check summary (logs in $OUT) =="
echo "pip install: rc=$pip_rc"
for log in pytest pytest_serial; do
    [ -s "$OUT/$log.log" ] && echo "$log: $(grep -E '[0-9]+ (passed|failed|error|skipped)|no tests ran' "$OUT/$log.log" | tail -n 1)"
done
echo "pytest rc=$pytest_rc$([ "$pytest_rc" = 124 ] && echo ' (timed out)')  serial rc=$serial_rc  bench rc=$bench_rc" \
    " hostcalls rc=$hostcalls_rc"
if [ -s "$OUT/bench.json" ]; then
    "$PY" -m bench --summary "$OUT/bench.json"
fi
[ -s "$OUT/bench_matmul.log" ] && tail -n 20 "$OUT/bench_matmul.log"
[ -s "$OUT/bench_distributed.log" ] && tail -n 12 "$OUT/bench_distributed.log"
# the counts, (budget) where it differs; $OUT/nvidia.json holds them as a budget file for tests/budgets/
[ -s "$OUT/host_calls.log" ] && sed -n '1,/^$/p' "$OUT/host_calls.log" && tail -n 3 "$OUT/host_calls.log"
[ "$pip_rc" = 0 ] && [[ "$pytest_rc" =~ ^(0|skipped)$ ]] && [[ "$serial_rc" =~ ^(0|skipped)$ ]] \
    && [[ "$bench_rc" =~ ^(0|skipped)$ ]] && [[ "$hostcalls_rc" =~ ^(0|skipped)$ ]]
