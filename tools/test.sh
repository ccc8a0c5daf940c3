#!/usr/bin/env bash
# Runs ruff, then pytest (in 2 processes, listing its 10 slowest tests; every test's time is in
# .check/pytest*.xml and testthat.xml), the Slurm and Ray cluster tests
# and, beside them, R CMD build (which runs the vignettes, once) and R CMD check (which runs
# testthat; --ignore-vignettes, as the build has just run them); prints each one's counts and a
# total, and exits non-zero if anything failed or R CMD check warned.
set -uo pipefail
cd "$(dirname "$0")/.."
export KERASDIST_PYTHON="$PWD/.venv/bin/python" KERASDIST_REQUIRE_PYTHON=1 TF_CPP_MIN_LOG_LEVEL=2
CHECK_DIR=.check
rm -rf "$CHECK_DIR" && mkdir -p "$CHECK_DIR"
export KERASDIST_TEST_LOGS="$PWD/$CHECK_DIR"  # conftest.py keeps its warm-start servers' logs there
export KERASDIST_CACHE_DIR="$PWD/$CHECK_DIR/cache"  # make_dataset's kept record counts: not the home's

# The machine's CPU use every 15 s while the suite runs (vmstat: us, sy, id, wa), to see where it idles.
vmstat -t 15 >"$CHECK_DIR/vmstat.log" 2>&1 &
vmstat_pid=$!
trap 'kill "$vmstat_pid" 2>/dev/null' EXIT

echo "== ruff check (lint rules in pyproject.toml)"
.venv/bin/ruff check . 2>&1 | tee "$CHECK_DIR/ruff.log"
ruff_status=${PIPESTATUS[0]}

# The R side runs beside pytest: the suites together keep about one of the two cores busy
# (much of their time is spent waiting on launched processes), so side by side they end sooner.
(
  tools/r_build.sh "$CHECK_DIR" &&
  cd "$CHECK_DIR" &&
  NOT_CRAN=true KERASDIST_TEST_TIMES="$PWD/testthat.xml" R CMD check --no-manual --ignore-vignettes kerasdist_*.tar.gz >check.log 2>&1
) >"$CHECK_DIR/r.log" 2>&1 &
r_pid=$!

# The cluster tests run beside the rest, one file after the other (one cluster at a time): the
# Slurm ones (tests/python/test_slurm.py), most of whose time is spent waiting on the scheduler
# (requeues, node timeouts, the time-limit check), then the Ray ones (tests/python/test_ray.py),
# whose Ray clusters start and fail over in real processes. In the main pool the Ray tests were
# its last 13 minutes (2026-11-29); here they follow the Slurm ones, which end sooner.
CLUSTER_TESTS=(tests/python/test_slurm.py tests/python/test_ray.py)
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=5 --junitxml="$CHECK_DIR/pytest-slurm.xml" "${CLUSTER_TESTS[@]}" >"$CHECK_DIR/pytest-slurm.log" 2>&1 &
slurm_pid=$!

# The rest of pytest runs in KERASDIST_TEST_WORKERS processes (pytest-xdist; 2 by default, 0 for
# one process). 3 were tried on 2026-11-26: no faster (pytest 26:56 in CI against 26:01 with 2) and
# the Slurm tests beside them slowed from 9-12 to 16 minutes. Tests are shared out one by one, a
# worker that runs dry taking from another (worksteal); module fixtures are made once per worker.
workers=${KERASDIST_TEST_WORKERS:-2}
parallel=()
[ "$workers" -gt 0 ] && parallel=(-n "$workers" --dist worksteal)
echo "== pytest"
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=10 --junitxml="$CHECK_DIR/pytest.xml" "${parallel[@]}" "${CLUSTER_TESTS[@]/#/--ignore=}" "$@" 2>&1 | tee "$CHECK_DIR/pytest.log"
py_status=${PIPESTATUS[0]}
[ "$ruff_status" -eq 0 ] || py_status=1  # a lint finding fails the Python side like a failed test

echo "== pytest ${CLUSTER_TESTS[*]} (started beside the rest)"
wait "$slurm_pid"
slurm_status=$?
cat "$CHECK_DIR/pytest-slurm.log"
[ "$slurm_status" -eq 0 ] || py_status=1

echo "== R CMD build + R CMD check (testthat runs inside; started beside pytest)"
wait "$r_pid"
r_build_status=$?
cat "$CHECK_DIR/r.log" "$CHECK_DIR/check.log" 2>/dev/null
rout=$(ls "$CHECK_DIR"/kerasdist.Rcheck/tests/testthat.Rout* 2>/dev/null | head -n 1)
r_counts=$( [ -n "$rout" ] && grep -E '^\[ FAIL [0-9]+ \| WARN [0-9]+ \| SKIP [0-9]+ \| PASS [0-9]+ \]' "$rout" | tail -n 1)
check_status=$(grep -E '^Status: ' "$CHECK_DIR/check.log" 2>/dev/null | tail -n 1)
[ -n "$rout" ] && grep -q 'FAIL [1-9]' "$rout" && sed -n '/══ Failed/,$p' "$rout" | head -n 80
# (NOT_CRAN=true above: testthat says where each warning came from only off CRAN)
[ -n "$rout" ] && grep -q 'WARN [1-9]' "$rout" && sed -n '/══ Warnings/,/══ Failed\|^\[ FAIL/p' "$rout" | head -n 60

count() { local n; n=$(grep -oE "[0-9]+ $1" <<<"$2" | grep -oE '^[0-9]+' | head -n 1); echo "${n:-0}"; }
py_summary=$(tail -n 1 "$CHECK_DIR/pytest.log")
slurm_summary=$(tail -n 1 "$CHECK_DIR/pytest-slurm.log")
py_pass=$(( $(count passed "$py_summary") + $(count passed "$slurm_summary") ))
py_fail=$(( $(count failed "$py_summary") + $(count error "$py_summary") + $(count failed "$slurm_summary") + $(count error "$slurm_summary") ))
py_skip=$(( $(count skipped "$py_summary") + $(count skipped "$slurm_summary") ))
r_pass=$(sed -E 's/.*PASS ([0-9]+).*/\1/' <<<"$r_counts"); r_fail=$(sed -E 's/.*FAIL ([0-9]+).*/\1/' <<<"$r_counts")
r_skip=$(sed -E 's/.*SKIP ([0-9]+).*/\1/' <<<"$r_counts")

echo
echo "pytest:        ${py_summary}"
echo "pytest Slurm, Ray: ${slurm_summary}"
echo "testthat:      ${r_counts:-no result (see $CHECK_DIR/kerasdist.Rcheck)}"
echo "R CMD check:   ${check_status:-no status}"
failed=$(( ${py_fail:-0} + ${r_fail:-1} ))
status=0
[ "$py_status" -eq 0 ] || status=1
[ "$r_build_status" -eq 0 ] && [ -n "$r_counts" ] || status=1
grep -qE 'ERROR|WARNING' <<<"${check_status:-ERROR}" && status=1
[ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "total: $(( ${py_pass:-0} + ${r_pass:-0} )) passed, $failed failed, $(( ${py_skip:-0} + ${r_skip:-0} )) skipped"
exit "$status"
