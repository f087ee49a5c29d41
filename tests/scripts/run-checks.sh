#!/usr/bin/env bash
# Test driver for the shell scripts of scripts/ (ctest runs it; see CMakeLists.txt).
#   run-checks.sh help SCRIPT                 --help exits 0 and shows a usage line
#   run-checks.sh not-found SCRIPT TOOL VAR   without TOOL (PATH, VAR, the fixed places):
#                                             exit 127 and a message saying where it looked
#                                             and how to get it
#   run-checks.sh fake-nsys SCRIPT            profile-nsys.sh drives a stand-in nsys correctly
#   run-checks.sh fake-ncu SCRIPT             profile-ncu.sh drives a stand-in ncu correctly
#   run-checks.sh fake-mpirun SCRIPT          bench-allreduce-mpi.sh drives a stand-in mpirun
#                                             correctly (order of builds, tags, summary, errors)
# Prints "FAIL: ..." for each failed check and exits 1 if any failed.
set -euo pipefail

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
empty="$tmp/empty" # a PATH and a WEFT_TOOL_ROOT holding nothing
mkdir -p "$empty"

# run_script OUT_PREFIX CMD...: runs CMD, stdout/stderr to OUT_PREFIX.out/.err, status to $rc.
run_script() {
  local out=$1
  shift
  rc=0
  "$@" > "$out.out" 2> "$out.err" || rc=$?
}

expect_rc() { # WHAT WANT
  if [[ "$rc" != "$2" ]]; then
    fail "$1: exit status $rc, expected $2; stderr: $(cat "$tmp/r.err")"
  fi
}

expect_in() { # WHAT FILE NEEDLE: FILE contains NEEDLE literally
  if ! grep -qF -- "$3" "$2"; then
    fail "$1: '$3' not in the output: $(cat "$2")"
  fi
}

expect_file() { # WHAT FILE EXPECTED-CONTENT
  local got
  got=$(cat "$2" 2> /dev/null || true)
  if [[ "$got" != "$3" ]]; then
    fail "$1: got"$'\n'"$got"$'\n'"expected"$'\n'"$3"
  fi
}

# A stand-in for nsys or ncu: logs its path and arguments to $FAKE_LOG, runs
# the program that follows "-o REPORT" and writes REPORT.<ext> (unless
# FAKE_NO_REPORT is set), returning the program's status; any other call
# (stats, --import) prints "fake report of: ARGS".
make_fake_tool() { # PATH EXTENSION
  mkdir -p "$(dirname "$1")"
  cat > "$1" <<EOF
#!/bin/sh
{ printf 'call(%s):' "\$0"; for a in "\$@"; do printf ' [%s]' "\$a"; done; printf '\n'; } >> "\$FAKE_LOG"
all="\$*"
report=""
n=\$#
i=0
while [ \$i -lt \$n ]; do
  i=\$((i + 1))
  if [ "\$1" = "-o" ]; then report=\$2; shift 2; break; fi
  shift
done
if [ -z "\$report" ]; then echo "fake report of: \$all"; exit 0; fi
"\$@"
status=\$?
[ -n "\${FAKE_NO_REPORT:-}" ] || : > "\$report.$2"
exit \$status
EOF
  chmod +x "$1"
}

# The profiled program: logs WEFT_PROFILE_SUMMARY (with FAKE_SHOW_ENV) and its
# arguments, exits $FAKE_EXIT.
prog="$tmp/bin/fakeprog"
mkdir -p "$tmp/bin"
cat > "$prog" <<'EOF'
#!/bin/sh
{ printf 'program:'; [ -z "${FAKE_SHOW_ENV:-}" ] || printf ' WEFT_PROFILE_SUMMARY=%s' "${WEFT_PROFILE_SUMMARY-<unset>}"
  for a in "$@"; do printf ' [%s]' "$a"; done; printf '\n'; } >> "$FAKE_LOG"
exit "${FAKE_EXIT:-0}"
EOF
chmod +x "$prog"
export FAKE_LOG="$tmp/log"

check_help() { # SCRIPT
  run_script "$tmp/r" "$1" --help
  expect_rc "$1 --help" 0
  if ! grep -qi "usage" "$tmp/r.out"; then fail "$1 --help: no usage line in: $(cat "$tmp/r.out")"; fi
  if [[ -s "$tmp/r.err" ]]; then fail "$1 --help wrote to stderr: $(cat "$tmp/r.err")"; fi
}

check_not_found() { # SCRIPT TOOL VAR
  local script=$1 tool=$2 var=$3
  run_script "$tmp/r" env -u NSYS -u NCU PATH="$empty" WEFT_TOOL_ROOT="$empty" /bin/bash "$script" /bin/true
  expect_rc "$tool missing" 127
  expect_in "$tool missing" "$tmp/r.err" "$tool was not found"
  expect_in "$tool missing" "$tmp/r.err" "PATH ($empty)"
  expect_in "$tool missing" "$tmp/r.err" "/usr/local/cuda/bin"
  expect_in "$tool missing" "$tmp/r.err" "/opt/nvidia/nsight-"
  expect_in "$tool missing" "$tmp/r.err" "CUDA toolkit"
  expect_in "$tool missing" "$tmp/r.err" "$var=/path/to/$tool"
  # A $VAR that is not a program: the same status, and the message says so.
  run_script "$tmp/r" env -u NSYS -u NCU "$var=$empty/no-such-$tool" PATH="$empty" WEFT_TOOL_ROOT="$empty" \
    /bin/bash "$script" /bin/true
  expect_rc "$var pointing nowhere" 127
  expect_in "$var pointing nowhere" "$tmp/r.err" "$var=$empty/no-such-$tool is not an executable"
}

check_fake_nsys() { # SCRIPT
  local script=$1 fake="$tmp/tools/nsys" got
  make_fake_tool "$fake" nsys-rep
  export FAKE_SHOW_ENV=1

  # NSYS, --output PATH, program arguments that look like options.
  : > "$FAKE_LOG"
  run_script "$tmp/r" env -u WEFT_PROFILE_SUMMARY NSYS="$fake" "$script" --output "$tmp/rep" "$prog" a "b c" --output x
  expect_rc "nsys run" 0
  expect_file "nsys run: calls" "$FAKE_LOG" \
    "call($fake): [profile] [--trace=cuda,nvtx,osrt] [--sample=none] [--force-overwrite=true] [-o] [$tmp/rep] [$prog] [a] [b c] [--output] [x]
program: WEFT_PROFILE_SUMMARY=1 [a] [b c] [--output] [x]
call($fake): [stats] [--force-export=true] [$tmp/rep.nsys-rep]"
  expect_in "nsys run: stats printed" "$tmp/r.out" "fake report of: stats --force-export=true $tmp/rep.nsys-rep"

  # WEFT_PROFILE_SUMMARY already set is kept; --output=PATH.nsys-rep; the program's status comes back.
  : > "$FAKE_LOG"
  run_script "$tmp/r" env WEFT_PROFILE_SUMMARY=0 FAKE_EXIT=3 NSYS="$fake" "$script" --output="$tmp/rep2.nsys-rep" -- "$prog"
  expect_rc "nsys, program failing" 3
  expect_file "nsys, program failing: calls" "$FAKE_LOG" \
    "call($fake): [profile] [--trace=cuda,nvtx,osrt] [--sample=none] [--force-overwrite=true] [-o] [$tmp/rep2] [$prog]
program: WEFT_PROFILE_SUMMARY=0
call($fake): [stats] [--force-export=true] [$tmp/rep2.nsys-rep]"

  # No report written: status 1 and a message.
  run_script "$tmp/r" env FAKE_NO_REPORT=1 NSYS="$fake" "$script" --output "$tmp/rep3" "$prog"
  expect_rc "nsys writing no report" 1
  expect_in "nsys writing no report" "$tmp/r.err" "wrote no report"

  # The fixed places (newest version first); default report name in the current directory.
  local root="$tmp/root"
  make_fake_tool "$root/opt/nvidia/nsight-systems/2023.4.1/bin/nsys" nsys-rep
  make_fake_tool "$root/opt/nvidia/nsight-systems/2024.2.1/bin/nsys" nsys-rep
  make_fake_tool "$root/opt/nvidia/nsight-compute/2024.1.0/host/target-linux-x64/nsys" nsys-rep
  mkdir -p "$tmp/cwd"
  : > "$FAKE_LOG"
  # shellcheck disable=SC2016  # expanded by that shell
  run_script "$tmp/r" bash -c 'cd "$1" && shift && exec env -u NSYS PATH="$0" WEFT_TOOL_ROOT="$1" /bin/bash "$2" "$3" z' \
    "$empty" "$tmp/cwd" "$root" "$script" "$prog"
  expect_rc "nsys from /opt/nvidia/nsight-systems" 0
  got=$(head -n 1 "$FAKE_LOG")
  if [[ ! "$got" =~ ^"call($root/opt/nvidia/nsight-systems/2024.2.1/bin/nsys): [profile] "(.*)" [-o] [weft-nsys-fakeprog-"[0-9]{8}-[0-9]{6}"] [$prog] [z]"$ ]]; then
    fail "nsys from /opt/nvidia/nsight-systems: first call $got"
  fi
  if ! compgen -G "$tmp/cwd/weft-nsys-fakeprog-*.nsys-rep" > /dev/null; then
    fail "nsys default report: no weft-nsys-fakeprog-*.nsys-rep in the current directory"
  fi
  # /usr/local/cuda/bin comes before /opt.
  make_fake_tool "$root/usr/local/cuda/bin/nsys" nsys-rep
  : > "$FAKE_LOG"
  run_script "$tmp/r" env -u NSYS PATH="$empty" WEFT_TOOL_ROOT="$root" /bin/bash "$script" --output "$tmp/rep4" "$prog"
  expect_rc "nsys from /usr/local/cuda/bin" 0
  expect_in "nsys from /usr/local/cuda/bin" "$FAKE_LOG" "call($root/usr/local/cuda/bin/nsys): [profile]"
  # PATH comes before the fixed places, NSYS before PATH.
  make_fake_tool "$tmp/pathbin/nsys" nsys-rep
  : > "$FAKE_LOG"
  run_script "$tmp/r" env -u NSYS PATH="$tmp/pathbin" WEFT_TOOL_ROOT="$root" /bin/bash "$script" --output "$tmp/rep5" "$prog"
  expect_rc "nsys from PATH" 0
  expect_in "nsys from PATH" "$FAKE_LOG" "call($tmp/pathbin/nsys): [profile]"
  : > "$FAKE_LOG"
  run_script "$tmp/r" env NSYS="$fake" PATH="$tmp/pathbin" WEFT_TOOL_ROOT="$root" /bin/bash "$script" --output "$tmp/rep6" "$prog"
  expect_rc "NSYS over PATH" 0
  expect_in "NSYS over PATH" "$FAKE_LOG" "call($fake): [profile]"

  # Usage errors: no program, unknown option, empty --output, a program that does not exist.
  for args in "" "--bogus $prog" "--output= $prog" "$tmp/no-such-program"; do
    # shellcheck disable=SC2086  # split on purpose
    run_script "$tmp/r" env NSYS="$fake" "$script" $args
    expect_rc "nsys usage error ($args)" 2
  done
  unset FAKE_SHOW_ENV
}

check_fake_ncu() { # SCRIPT
  local script=$1 fake="$tmp/tools/ncu" got
  make_fake_tool "$fake" ncu-rep

  # All options; options after the program belong to the program.
  : > "$FAKE_LOG"
  run_script "$tmp/r" env NCU="$fake" "$script" --kernel 'gemm|conv' --launch-count 5 --output "$tmp/rep" \
    "$prog" --kernel x --launch-count 7
  expect_rc "ncu run" 0
  expect_file "ncu run: calls" "$FAKE_LOG" \
    "call($fake): [--set] [full] [--kernel-name-base] [demangled] [--kernel-name] [regex:gemm|conv] [--launch-count] [5] [--force-overwrite] [-o] [$tmp/rep] [$prog] [--kernel] [x] [--launch-count] [7]
program: [--kernel] [x] [--launch-count] [7]
call($fake): [--import] [$tmp/rep.ncu-rep] [--print-summary] [per-kernel]"
  expect_in "ncu run: summary printed" "$tmp/r.out" "fake report of: --import $tmp/rep.ncu-rep --print-summary per-kernel"

  # Defaults (every kernel, 20 launches), --details, =-forms, the program's status.
  : > "$FAKE_LOG"
  run_script "$tmp/r" env FAKE_EXIT=4 NCU="$fake" "$script" --details --output="$tmp/rep2.ncu-rep" -- "$prog" a
  expect_rc "ncu, program failing" 4
  expect_file "ncu defaults: calls" "$FAKE_LOG" \
    "call($fake): [--set] [full] [--launch-count] [20] [--force-overwrite] [-o] [$tmp/rep2] [$prog] [a]
program: [a]
call($fake): [--import] [$tmp/rep2.ncu-rep] [--page] [details]"
  : > "$FAKE_LOG"
  run_script "$tmp/r" env NCU="$fake" "$script" --kernel=k1 --launch-count=3 --output "$tmp/rep3" "$prog"
  expect_rc "ncu =-forms" 0
  expect_in "ncu =-forms" "$FAKE_LOG" "[--kernel-name-base] [demangled] [--kernel-name] [regex:k1] [--launch-count] [3] [--force-overwrite] [-o] [$tmp/rep3] [$prog]"

  # No report (no kernel matched): status 1 and a message.
  run_script "$tmp/r" env FAKE_NO_REPORT=1 NCU="$fake" "$script" --output "$tmp/rep4" "$prog"
  expect_rc "ncu writing no report" 1
  expect_in "ncu writing no report" "$tmp/r.err" "wrote no report"

  # The fixed places: newest /opt/nvidia/nsight-compute/*, but /usr/local/cuda/bin first; default report name.
  local root="$tmp/root-ncu"
  make_fake_tool "$root/opt/nvidia/nsight-compute/2023.3.0/ncu" ncu-rep
  make_fake_tool "$root/opt/nvidia/nsight-compute/2024.1.0/ncu" ncu-rep
  mkdir -p "$tmp/cwd-ncu"
  : > "$FAKE_LOG"
  # shellcheck disable=SC2016  # expanded by that shell
  run_script "$tmp/r" bash -c 'cd "$1" && shift && exec env -u NCU PATH="$0" WEFT_TOOL_ROOT="$1" /bin/bash "$2" "$3"' \
    "$empty" "$tmp/cwd-ncu" "$root" "$script" "$prog"
  expect_rc "ncu from /opt/nvidia/nsight-compute" 0
  got=$(head -n 1 "$FAKE_LOG")
  if [[ ! "$got" =~ ^"call($root/opt/nvidia/nsight-compute/2024.1.0/ncu): [--set] [full] [--launch-count] [20] [--force-overwrite] [-o] [weft-ncu-fakeprog-"[0-9]{8}-[0-9]{6}"] [$prog]"$ ]]; then
    fail "ncu from /opt/nvidia/nsight-compute: first call $got"
  fi
  if ! compgen -G "$tmp/cwd-ncu/weft-ncu-fakeprog-*.ncu-rep" > /dev/null; then
    fail "ncu default report: no weft-ncu-fakeprog-*.ncu-rep in the current directory"
  fi
  make_fake_tool "$root/usr/local/cuda/bin/ncu" ncu-rep
  : > "$FAKE_LOG"
  run_script "$tmp/r" env -u NCU PATH="$empty" WEFT_TOOL_ROOT="$root" /bin/bash "$script" --output "$tmp/rep5" "$prog"
  expect_rc "ncu from /usr/local/cuda/bin" 0
  expect_in "ncu from /usr/local/cuda/bin" "$FAKE_LOG" "call($root/usr/local/cuda/bin/ncu): [--set]"
  make_fake_tool "$tmp/pathbin/ncu" ncu-rep
  : > "$FAKE_LOG"
  run_script "$tmp/r" env -u NCU PATH="$tmp/pathbin" WEFT_TOOL_ROOT="$root" /bin/bash "$script" --output "$tmp/rep6" "$prog"
  expect_rc "ncu from PATH" 0
  expect_in "ncu from PATH" "$FAKE_LOG" "call($tmp/pathbin/ncu): [--set]"

  # Usage errors.
  for args in "" "--launch-count 0 $prog" "--launch-count abc $prog" "--kernel" "--bogus $prog" \
    "$tmp/no-such-program"; do
    # shellcheck disable=SC2086  # split on purpose
    run_script "$tmp/r" env NCU="$fake" "$script" $args
    expect_rc "ncu usage error ($args)" 2
  done
}

check_fake_mpirun() { # SCRIPT
  local script=$1 mpibin="$tmp/mpibin" root_flag="" expected="" run np build exe
  mkdir -p "$mpibin"
  # Logs its arguments; prints a text line and two rows of the MPI rows for
  # -np N (ranks N), weft_mpi 1.1x mpi; exits $FAKE_EXIT.
  cat > "$mpibin/mpirun" <<'EOF2'
#!/bin/sh
{ printf 'mpirun:'; for a in "$@"; do printf ' [%s]' "$a"; done; printf '\n'; } >> "$FAKE_LOG"
np=0
prev=""
for a in "$@"; do [ "$prev" = "-np" ] && np=$a; prev=$a; done
echo "weft-bench-allreduce: a text line"
echo "{\"impl\":\"weft_mpi\",\"ranks\":$np,\"bytes\":1048576,\"time_us\":110.0,\"peer\":\"mpi\",\"vs_peer\":1.1}"
echo "{\"impl\":\"mpi\",\"ranks\":$np,\"bytes\":1048576,\"time_us\":100.0}"
exit "${FAKE_EXIT:-0}"
EOF2
  chmod +x "$mpibin/mpirun"
  local new="$tmp/bin/bench-new" base="$tmp/bin/bench-base"
  printf '#!/bin/sh\nexit 9\n' > "$new"
  cp "$new" "$base"
  chmod +x "$new" "$base"
  if ((EUID == 0)); then root_flag=" [--allow-run-as-root]"; fi
  # Which build goes first alternates from run to run.
  for run in 1 2; do
    for np in 2 3; do
      for build in base new; do
        if ((run == 2)); then  # base, new -> new, base
          if [[ $build == base ]]; then build=new; else build=base; fi
        fi
        exe=$new
        if [[ $build == base ]]; then exe=$base; fi
        expected+="mpirun: [--bind-to] [none] [--oversubscribe]$root_flag [--mca] [btl_vader_single_copy_mechanism] [cma] [-np] [$np] [$exe] [--json] [--reps] [1]"$'\n'
      done
    done
  done
  : > "$FAKE_LOG"
  run_script "$tmp/r" env PATH="$mpibin:$PATH" "$script" --bin "$new" --baseline "$base" --ranks "2 3" --runs 2 \
    --out "$tmp/ab.jsonl" -- --reps 1
  expect_rc "mpirun A/B" 0
  expect_file "mpirun A/B: calls" "$FAKE_LOG" "${expected%$'\n'}"
  if [[ $(wc -l < "$tmp/ab.jsonl") != 16 || $(grep -c '^{"build":"new","run":[12],"impl":"' "$tmp/ab.jsonl") != 8 ||
    $(grep -c '^{"build":"base","run":[12],"impl":"' "$tmp/ab.jsonl") != 8 ]]; then
    fail "mpirun A/B: tagged lines: $(cat "$tmp/ab.jsonl")"
  fi
  expect_in "mpirun A/B: summary" "$tmp/r.out" "| base | 3 | 1 MiB | 110 | 100 | 1.10 (1.10-1.10) | 1.10 (1.10-1.10) |"
  expect_in "mpirun A/B: summary" "$tmp/r.out" "| new | 2 | 1 MiB | 110 | 100 | 1.10 (1.10-1.10) | 1.10 (1.10-1.10) |"

  # One binary, --transport default: no --mca; a failing mpirun fails the script.
  : > "$FAKE_LOG"
  run_script "$tmp/r" env PATH="$mpibin:$PATH" FAKE_EXIT=1 "$script" --bin "$new" --ranks 2 --runs 1 \
    --transport default --out "$tmp/one.jsonl"
  expect_rc "mpirun failing" 1
  expect_file "one binary: calls" "$FAKE_LOG" \
    "mpirun: [--bind-to] [none] [--oversubscribe]$root_flag [-np] [2] [$new] [--json] [--members] [1] [--min-bytes] [1048576] [--max-bytes] [16777216] [--reps] [11]"
  expect_in "mpirun failing" "$tmp/r.err" "run 1, 2 ranks, new failed"

  # --call-times: the interposer beside --bin is preloaded (before what
  # LD_PRELOAD held); without it, a usage error naming it.
  : > "$FAKE_LOG"
  run_script "$tmp/r" env PATH="$mpibin:$PATH" LD_PRELOAD= "$script" --bin "$new" --ranks 2 --runs 1 --call-times \
    --out "$tmp/ct.jsonl" -- --reps 1
  expect_rc "--call-times without the interposer" 2
  expect_in "--call-times without the interposer" "$tmp/r.err" "libweft-mpi-call-times.so"
  if [[ -s "$FAKE_LOG" ]]; then fail "--call-times without the interposer ran mpirun"; fi
  : > "$tmp/bin/libweft-mpi-call-times.so"
  : > "$FAKE_LOG"
  run_script "$tmp/r" env PATH="$mpibin:$PATH" LD_PRELOAD=/elsewhere.so "$script" --bin "$new" --ranks 2 --runs 1 \
    --call-times --out "$tmp/ct.jsonl" -- --reps 1
  expect_rc "--call-times" 0
  expect_file "--call-times: calls" "$FAKE_LOG" \
    "mpirun: [--bind-to] [none] [--oversubscribe]$root_flag [--mca] [btl_vader_single_copy_mechanism] [cma] [-x] [LD_PRELOAD=$tmp/bin/libweft-mpi-call-times.so:/elsewhere.so] [-np] [2] [$new] [--json] [--reps] [1]"

  # Usage errors, each before anything runs.
  for args in "--runs 0" "--ranks 1" "--ranks x" "--transport tcp" "--bin $tmp/no-such-bench" "--bogus"; do
    : > "$FAKE_LOG"
    # shellcheck disable=SC2086  # split on purpose
    run_script "$tmp/r" env PATH="$mpibin:$PATH" "$script" --bin "$new" --out "$tmp/err.jsonl" $args
    expect_rc "bench-allreduce-mpi usage error ($args)" 2
    if [[ -s "$FAKE_LOG" ]]; then fail "bench-allreduce-mpi usage error ($args) ran mpirun"; fi
  done
}

if (($# < 2)) || [[ ! -f "$2" ]]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
script="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")" # absolute: some checks change directory
case "$1" in
  help) check_help "$script" ;;
  not-found) check_not_found "$script" "$3" "$4" ;;
  fake-nsys) check_fake_nsys "$script" ;;
  fake-ncu) check_fake_ncu "$script" ;;
  fake-mpirun) check_fake_mpirun "$script" ;;
  *)
    sed -n '2,11p' "$0" >&2
    exit 2
    ;;
esac

if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "ok: $*"
