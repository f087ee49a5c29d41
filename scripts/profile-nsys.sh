#!/usr/bin/env bash
# Profiles a program with NVIDIA Nsight Systems (nsys), then prints the
# report's summary tables (nsys stats).
# Usage: scripts/profile-nsys.sh [--output PATH] [--] PROGRAM [ARGS...]   (--help for more)
set -euo pipefail
# shellcheck source=SCRIPTDIR/find-tool.sh
source "${BASH_SOURCE[0]%/*}/find-tool.sh"

me=profile-nsys.sh

usage() {
  cat <<'EOF'
usage: scripts/profile-nsys.sh [--output PATH] [--] PROGRAM [ARGS...]

Runs PROGRAM ARGS under NVIDIA Nsight Systems:
  nsys profile --trace=cuda,nvtx,osrt --sample=none --force-overwrite=true -o REPORT PROGRAM ARGS...
then prints the report's summary tables (CUDA API and kernel times, memory
copies, NVTX ranges: Weft names each op's range after the op):
  nsys stats --force-export=true REPORT.nsys-rep
Open REPORT.nsys-rep in the Nsight Systems GUI (nsys-ui) for the timeline.

Options (before PROGRAM; everything from PROGRAM on is passed to it as is):
  --output PATH   report path, with or without .nsys-rep
                  (default: weft-nsys-<PROGRAM basename>-<YYYYmmdd-HHMMSS> in
                  the current directory)
  --              end of options (for a PROGRAM whose name starts with -)
  -h, --help      this text

Environment:
  NSYS=/path/to/nsys    the nsys to run (skips the search below)
  WEFT_PROFILE_SUMMARY  set to 1 for PROGRAM unless already set, so that a
                        Weft program also prints its own busy-time and overlap
                        summary at exit (see docs/trace-format.md)
  WEFT_TOOL_ROOT        prefix of the fixed locations below (default: none;
                        the tests point it at an empty directory)

nsys is looked for on PATH, then in /usr/local/cuda/bin,
/opt/nvidia/nsight-systems/*/bin and
/opt/nvidia/nsight-compute/*/host/target-linux-x64 (the last version in
sorted order first). Without it the script exits 127 and says how to get it:
NVIDIA Nsight Systems comes with the CUDA toolkit installers, or as the
nsight-systems package from NVIDIA's CUDA repository.

Exit status: PROGRAM's (as nsys reports it), 1 when no report was written or
nsys stats failed, 2 for a usage error, 127 when nsys was not found.

Example:
  scripts/profile-nsys.sh --output /tmp/lenet build/examples/weft-train-lenet --epochs 1 --limit 512
EOF
}

usage_error() {
  echo "$me: $1 (see --help)" >&2
  exit 2
}

output=""
while (($# > 0)); do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --output)
      if (($# < 2)) || [[ -z "$2" ]]; then usage_error "--output needs a path"; fi
      output=$2
      shift 2
      ;;
    --output=*)
      output=${1#--output=}
      [[ -n "$output" ]] || usage_error "--output needs a path"
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

# The tool: $NSYS, else PATH, else the fixed locations (newest version first).
root=${WEFT_TOOL_ROOT:-}
require_nsight "$me" nsys NSYS "Nsight Systems" nsight-systems "$root/usr/local/cuda/bin/nsys" \
  "$root/opt/nvidia/nsight-systems/*/bin/nsys" "$root/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"

program=$1
if ! command -v -- "$program" > /dev/null; then
  usage_error "program not found: $program"
fi

report=$(report_base nsys .nsys-rep "$program" "$output")

export WEFT_PROFILE_SUMMARY="${WEFT_PROFILE_SUMMARY-1}"

echo "$me: $tool profile ... -o $report $*" >&2
status=0
"$tool" profile --trace=cuda,nvtx,osrt --sample=none --force-overwrite=true -o "$report" "$@" || status=$?
if [[ ! -f "$report.nsys-rep" ]]; then
  echo "$me: nsys wrote no report ($report.nsys-rep); exit status $status" >&2
  ((status != 0)) || status=1
  exit "$status"
fi
if ! "$tool" stats --force-export=true "$report.nsys-rep"; then
  echo "$me: nsys stats failed on $report.nsys-rep" >&2
  ((status != 0)) || status=1
fi
echo "$me: report: $report.nsys-rep (open it in nsys-ui for the timeline)" >&2
exit "$status"
