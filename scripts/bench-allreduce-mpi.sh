#!/usr/bin/env bash
# Weft over MPI against plain MPI_Allreduce, as docs/performance.md measures it
# ("Collectives"): weft-bench-allreduce under mpirun, several
# runs for each rank count, then scripts/allreduce-summary over them. With
# --baseline, a second binary alternates with the first in every run (which
# goes first alternates too), and the summary has a row for each: an A/B of
# two builds on one machine in one sitting, the only comparison that holds on
# machines whose MPI speed moves 10-20% between runs.
#
# usage: scripts/bench-allreduce-mpi.sh [options] [-- BENCH_ARGS...]
#   --bin PATH        weft-bench-allreduce (default build/bench/weft-bench-allreduce)
#   --baseline PATH   a second weft-bench-allreduce to alternate with (rows "base";
#                     the first binary's rows are "new")
#   --ranks "N..."    rank counts (default "2 4")
#   --runs N          runs of each rank count, and of each binary (default 3)
#   --out FILE        the JSON lines, tagged with build and run (default
#                     weft-allreduce-mpi-<date>.jsonl)
#   --transport T     cma (default: Open MPI's shared-memory BTL copies once,
#                     through process_vm_readv) or default (what Open MPI picks)
#   --call-times      preload the MPI profiling interposer weft-mpi-call-times
#                     (libweft-mpi-call-times.so beside --bin, into both builds'
#                     runs: it does not depend on Weft): the summary then
#                     splits each implementation's time per call into the parts
#                     inside and outside MPI_Allreduce
#   BENCH_ARGS        weft-bench-allreduce's own flags (default: --members 1
#                     --min-bytes 1048576 --max-bytes 16777216 --reps 11)
# Ranks are launched with --bind-to none (Weft's threads need more than one
# core per rank) and, as root, --allow-run-as-root; --oversubscribe lets more
# ranks than cores run (their figures then say little). WEFT_GPU_BACKEND
# defaults to none: this measures the CPU path.
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=build/bench/weft-bench-allreduce
baseline=""
ranks="2 4"
runs=3
out="weft-allreduce-mpi-$(date +%Y%m%d-%H%M%S).jsonl"
transport=cma
call_times=0
bench_args=(--members 1 --min-bytes 1048576 --max-bytes 16777216 --reps 11)
die() { echo "bench-allreduce-mpi.sh: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --bin) bin=${2:?--bin needs a path}; shift 2 ;;
    --baseline) baseline=${2:?--baseline needs a path}; shift 2 ;;
    --ranks) ranks=${2:?--ranks needs rank counts}; shift 2 ;;
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    --out) out=${2:?--out needs a file}; shift 2 ;;
    --transport) transport=${2:?--transport needs cma or default}; shift 2 ;;
    --call-times) call_times=1; shift ;;
    -h | --help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; bench_args=("$@"); break ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "--runs wants a positive number, not '$runs'"
for r in $ranks; do
  [[ $r =~ ^[1-9][0-9]*$ && $r -ge 2 ]] || die "--ranks wants counts of 2 or more, not '$r'"
done
[[ $transport == cma || $transport == default ]] || die "--transport is cma or default, not '$transport'"
for b in "$bin" ${baseline:+"$baseline"}; do
  [[ -x $b ]] || die "no executable $b (build it: cmake --build build --target weft-bench-allreduce)"
done
command -v mpirun > /dev/null || die "no mpirun on PATH (Open MPI: scripts/setup-debian.sh installs it)"

launch=(mpirun --bind-to none --oversubscribe)
((EUID == 0)) && launch+=(--allow-run-as-root)
[[ $transport == cma ]] && launch+=(--mca btl_vader_single_copy_mechanism cma)
if ((call_times)); then
  shim=$(cd "$(dirname "$bin")" && pwd)/libweft-mpi-call-times.so
  [[ -f $shim ]] || die "no $shim (build it: cmake --build build --target weft-mpi-call-times)"
  launch+=(-x "LD_PRELOAD=$shim${LD_PRELOAD:+:$LD_PRELOAD}")
fi
export WEFT_GPU_BACKEND=${WEFT_GPU_BACKEND:-none}
: > "$out" || die "cannot write $out"
failed=0
for ((run = 1; run <= runs; run++)); do
  builds=(new)
  [[ -n $baseline ]] && { ((run % 2)) && builds=(base new) || builds=(new base); }
  for np in $ranks; do
    for build in "${builds[@]}"; do
      exe=$bin
      [[ $build == base ]] && exe=$baseline
      echo "run $run, $np ranks, $build: ${launch[*]} -np $np $exe --json ${bench_args[*]}" >&2
      # Each JSON line tagged with its build and run (rank 0 prints them).
      if ! "${launch[@]}" -np "$np" "$exe" --json "${bench_args[@]}" |
        sed -n "s/^{/{\"build\":\"$build\",\"run\":$run,/p" >> "$out"; then
        echo "bench-allreduce-mpi.sh: run $run, $np ranks, $build failed" >&2
        failed=1
      fi
    done
  done
done
echo "JSON lines: $out" >&2
python3 "$here/scripts/allreduce-summary" "$out" || failed=1
exit $failed
