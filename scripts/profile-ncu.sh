#!/usr/bin/env bash
# Profiles the GPU kernels of a program with NVIDIA Nsight Compute (ncu),
# then prints the report's per-kernel summary.
# Usage: scripts/profile-ncu.sh [--kernel REGEX] [--launch-count N] [--output PATH] [--details] [--] PROGRAM [ARGS...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/find-tool.sh
source "${BASH_SOURCE[0]%/*}/find-tool.sh"

me=profile-ncu.sh

usage() {
  cat <<'EOF'
usage: scripts/profile-ncu.sh [--kernel REGEX] [--launch-count N] [--output PATH] [--details]
                              [--] PROGRAM [ARGS...]

Runs PROGRAM ARGS under NVIDIA Nsight Compute, collecting the full metric
set for the first N kernel launches (whose name matches REGEX):
  ncu --set full [--kernel-name-base demangled --kernel-name regex:REGEX] --launch-count N --force-overwrite -o REPORT PROGRAM ARGS...
then prints the report:
  ncu --import REPORT.ncu-rep --print-summary per-kernel     (default)
  ncu --import REPORT.ncu-rep --page details                 (--details)
Open REPORT.ncu-rep in the Nsight Compute GUI (ncu-ui) for everything else.

Options go BEFORE PROGRAM: everything from PROGRAM on is passed to it as is,
so a --kernel after the program is the program's argument, not this script's.
  --kernel REGEX      profile only kernels whose demangled name (template
                      arguments included: cuBLAS 13's GEMMs are named
                      Kernel2<cutlass_80_simt_sgemm_...>) matches the regular
                      expression, e.g. --kernel 'gemm|conv' (default: every
                      kernel)
  --launch-count N    stop after N matching launches (default 20; the full
                      set replays each kernel many times, so keep N small)
  --output PATH       report path, with or without .ncu-rep (default:
                      weft-ncu-<PROGRAM basename>-<YYYYmmdd-HHMMSS>)
  --details           print the details page of every profiled launch instead
                      of the per-kernel summary
  --                  end of options (for a PROGRAM whose name starts with -)
  -h, --help          this text

Environment:
  NCU=/path/to/ncu    the ncu to run (skips the search below)
  WEFT_TOOL_ROOT      prefix of the fixed locations below (default: none; the
                      tests point it at an empty directory)

ncu is looked for on PATH, then in /usr/local/cuda/bin and
/opt/nvidia/nsight-compute/*/ (the last version in sorted order first).
Without it the script exits 127 and says how to get it: NVIDIA Nsight
Compute comes with the CUDA toolkit installers, or as the nsight-compute
package from NVIDIA's CUDA repository. Reading GPU performance counters
needs root or the driver option NVreg_RestrictProfilingToAdminUsers=0
(ncu reports ERR_NVGPUCTRPERM otherwise).

Exit status: PROGRAM's (as ncu reports it), 1 when no report was written or
the import failed, 2 for a usage error, 127 when ncu was not found.

Example:
  scripts/profile-ncu.sh --kernel gemm --launch-count 5 build/examples/weft-demo --products 2
EOF
}

usage_error() {
  echo "$me: $1 (see --help)" >&2
  exit 2
}

kernel=""
launch_count=20
output=""
page=(--print-summary per-kernel)
while (($# > 0)); do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --kernel | --launch-count | --output)
      if (($# < 2)) || [[ -z "$2" ]]; then usage_error "$1 needs a value"; fi
      case "$1" in
        --kernel) kernel=$2 ;;
        --launch-count) launch_count=$2 ;;
        --output) output=$2 ;;
      esac
      shift 2
      ;;
    --kernel=* | --launch-count=* | --output=*)
      value=${1#*=}
      [[ -n "$value" ]] || usage_error "${1%%=*} needs a value"
      case "$1" in
        --kernel=*) kernel=$value ;;
        --launch-count=*) launch_count=$value ;;
        --output=*) output=$value ;;
      esac
      shift
      ;;
    --details)
      page=(--page details)
      shift
      ;;
    --)
      shift
      break
      ;;
    -*) usage_error "unknown option $1 (options go before the program)" ;;
    *) break ;;
  esac
done
(($# >= 1)) || usage_error "no program given"
[[ "$launch_count" =~ ^[1-9][0-9]*$ ]] || usage_error "--launch-count must be a positive integer, not '$launch_count'"

# The tool: $NCU, else PATH, else the fixed locations (newest version first).
root=${WEFT_TOOL_ROOT:-}
require_nsight "$me" ncu NCU "Nsight Compute" nsight-compute \
  "$root/usr/local/cuda/bin/ncu" "$root/opt/nvidia/nsight-compute/*/ncu"

program=$1
if ! command -v -- "$program" > /dev/null; then
  usage_error "program not found: $program"
fi

report=$(report_base ncu .ncu-rep "$program" "$output")

cmd=("$tool" --set full)
if [[ -n "$kernel" ]]; then cmd+=(--kernel-name-base demangled --kernel-name "regex:$kernel"); fi
cmd+=(--launch-count "$launch_count" --force-overwrite -o "$report" "$@")
echo "$me: ${cmd[*]}" >&2
status=0
"${cmd[@]}" || status=$?
if [[ ! -f "$report.ncu-rep" ]]; then
  echo "$me: ncu wrote no report ($report.ncu-rep; did any kernel launch match?); exit status $status" >&2
  ((status != 0)) || status=1
  exit "$status"
fi
if ! "$tool" --import "$report.ncu-rep" "${page[@]}"; then
  echo "$me: ncu --import failed on $report.ncu-rep" >&2
  ((status != 0)) || status=1
fi
echo "$me: report: $report.ncu-rep (open it in ncu-ui)" >&2
exit "$status"
