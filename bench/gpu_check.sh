#!/usr/bin/env bash
# One command for a GPU machine, run from the repo root: install, run the tests on the real GPU,
# then the benchmark, and end with a short summary. A test failure is reported; the bench still runs.
# Logs and bench.json go to $OUT (the device tool's output folder), or to a temporary folder.
# $TESTS narrows the test run (default: tests).
set -u
export PYTHONUNBUFFERED=1
export MINITENSOR_BACKEND=nvidia
PY="${PYTHON:-python3}"  # the GPU image's python3 is the one with torch and CuPy
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"

"$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tee "$OUT/pip.log"
pip_rc=${PIPESTATUS[0]}

# A hung test must not eat the bench's time: the device tool stops a command after 10 minutes.
timeout "${PYTEST_TIMEOUT_S:-300}" "$PY" -m pytest -q --maxfail=50 -p no:cacheprovider ${TESTS:-tests} 2>&1 | tee "$OUT/pytest.log"
pytest_rc=${PIPESTATUS[0]}

rm -f "$OUT/bench.json"
"$PY" -m bench --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}

echo
echo "== gpu_check summary (logs in $OUT) =="
echo "pip install: rc=$pip_rc"
echo "pytest: rc=$pytest_rc$([ "$pytest_rc" -eq 124 ] && echo ' (timed out)')  $(grep -E '[0-9]+ (passed|failed|error|skipped)|no tests ran' "$OUT/pytest.log" | tail -n 1)"
echo "bench: rc=$bench_rc"
if [ -s "$OUT/bench.json" ]; then
    "$PY" -m bench --summary "$OUT/bench.json"
fi
[ "$pip_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
