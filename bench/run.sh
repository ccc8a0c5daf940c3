#!/usr/bin/env bash
# Run the benchmarks in order, then bench/summarize.py: bench/results/NAME.json per benchmark,
# bench/results/summary.md and summary.png, each benchmark's stderr in bench/results/logs/.
# `make bench` runs this with no arguments: every benchmark, 14-18 minutes on 2 CPU cores
# (13 min 52 s and 17 min 51 s on 2026-11-28).
#
#   bench/run.sh [NAME ...]            names from the list below (or script names): only those
#   BENCH_ARGS_checkpoint="--repeats 2" bench/run.sh checkpoint    other arguments for one
#
# A benchmark that fails does not stop the others; the run exits 1 naming it at the end. A
# script that is missing stops the run before anything starts.
set -euo pipefail
cd "$(dirname "$0")/.."

export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
PYTHON="${KERASDIST_PYTHON:-$PWD/.venv/bin/python}"
export KERASDIST_PYTHON="$PYTHON"

# name|script|arguments. The arguments keep the whole run well under 15 minutes on the 2-core
# development machine: 9 min 43 s in all on 2026-11-24 with nothing else running (data 40 s,
# data_r 21 s, checkpoint 82 s, multi_worker 80 s, overhead 179 s, custom_loop 51 s, speed 26 s,
# r_python 26 s, advisor 77 s); about twice that while other test runs load the same cores.
# checkpoint has since become 4 variants x (a warm-up + 3 rounds) of 10-epoch fits: about 3.5 min
# by its epoch time (1.4 s at 4096 samples), not yet timed in a whole quiet run; save_contention
# about 50 s. checkpoint_scale (issue #47: 60 MB and 600 MB of model state, 2 rounds, a fresh
# process per restore) took 4 min 45 s on 2026-11-27 with another engineer's tests running (load 5-7);
# its 2.4 GB size is `BENCH_ARGS_checkpoint_scale="--sizes 2.4G" bench/run.sh checkpoint_scale`.
BENCHMARKS=(
  "data|bench_data.py|--reps 15 --epochs 5"
  "data_r|bench_data.R|2e5 100 5"
  "checkpoint|bench_checkpoint.py|--samples 4096 --epochs 10 --repeats 3 --with-equal-priority-writer"
  "save_contention|bench_save_contention.py|--steps 30 --repeats 3"
  "multi_worker|bench_multi_worker.py|--widths 64,2048 --repeats 2 --steps 30"
  "overhead|bench_overhead.py|--seconds 30 --repeats 3"
  "custom_loop|bench_custom_loop.py|--repeats 7 --epochs 3 --samples 8192"
  "speed|bench_speed.py|--repeats 3 --epochs 3 --samples 8192"
  "r_python|bench_r_python.py|"
  "advisor|bench_advisor.py|"
  "cli|bench_cli.py|--repeats 10"
  "warm_start|bench_warm_start.py|--repeats 5"
  "checkpoint_scale|bench_checkpoint_scale.py|--sizes 60M,600M --repeats 2"
  "user_data|bench_user_data.py|--reps 5 --file-gb 1.0"
)

names=()
for entry in "${BENCHMARKS[@]}"; do names+=("${entry%%|*}"); done

selected=()
for want in "$@"; do
  found=""
  for entry in "${BENCHMARKS[@]}"; do
    IFS="|" read -r name script _ <<<"$entry"
    if [ "$want" = "$name" ] || [ "$want" = "$script" ] || [ "$want" = "bench/$script" ]; then
      found="$name"
    fi
  done
  if [ -z "$found" ]; then
    echo "bench/run.sh: no benchmark '$want'; known: ${names[*]}" >&2
    exit 2
  fi
  selected+=("$found")
done

# The benchmarks to run, in the order of BENCHMARKS; all of them when none is named.
plan=()
for entry in "${BENCHMARKS[@]}"; do
  name="${entry%%|*}"
  if [ "$#" -eq 0 ] || [[ " ${selected[*]} " == *" $name "* ]]; then plan+=("$entry"); fi
done

missing=()
for entry in "${plan[@]}"; do
  IFS="|" read -r _ script _ <<<"$entry"
  [ -f "bench/$script" ] || missing+=("bench/$script")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "bench/run.sh: MISSING benchmark script(s): ${missing[*]}" >&2
  exit 1
fi

mkdir -p bench/results/logs
started=$(date +%s)
failed=()
for entry in "${plan[@]}"; do
  IFS="|" read -r name script args <<<"$entry"
  override="BENCH_ARGS_$name"
  args="${!override-$args}"
  log="bench/results/logs/$name.log"
  case "$script" in
    *.R) cmd=(Rscript "bench/$script") ;;
    *) cmd=("$PYTHON" "bench/$script") ;;
  esac
  echo "-- bench/$script $args  (stderr: $log)"
  t0=$SECONDS
  # shellcheck disable=SC2086  # the arguments are words
  if "${cmd[@]}" $args 2>"$log"; then
    echo "== $script ($((SECONDS - t0)) s)"
  else
    status=$?
    echo "== $script FAILED with exit status $status after $((SECONDS - t0)) s; the end of $log:" >&2
    tail -n 20 "$log" >&2
    failed+=("$script")
  fi
  echo
done

"$PYTHON" bench/summarize.py --since "$started"
total=$(($(date +%s) - started))
echo "== total: $((total / 60)) min $((total % 60)) s for ${#plan[@]} benchmark(s) and the summary"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "bench/run.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
