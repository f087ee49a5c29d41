# shellcheck shell=bash
# Sourced by profile-nsys.sh and profile-ncu.sh: finding the Nsight tool and
# naming the report (bash built-ins only, so it works with an empty PATH).
# find_tool NAME PATTERN...: prints NAME's path on PATH, else the last
# (newest-versioned) executable file matching the first pattern that has one;
# prints nothing when there is none.
find_tool() {
  local name=$1 pattern i
  shift
  if command -v "$name"; then return 0; fi
  local -a matches
  shopt -s nullglob
  for pattern in "$@"; do
    # shellcheck disable=SC2206  # the pattern is meant to be expanded here
    matches=($pattern)
    for ((i = ${#matches[@]} - 1; i >= 0; i--)); do
      if [[ -f "${matches[i]}" && -x "${matches[i]}" ]]; then
        printf '%s\n' "${matches[i]}"
        shopt -u nullglob
        return 0
      fi
    done
  done
  shopt -u nullglob
}

# require_nsight ME NAME ENVVAR PRODUCT SLUG PATTERN...: sets `tool` to the
# Nsight command-line tool NAME: $ENVVAR when set (it must be an executable
# file), else find_tool NAME PATTERN...; when there is none, says where it
# looked and how to get the tool, and exits 127. SLUG names the product's
# package and web page (nsight-systems, nsight-compute).
require_nsight() {
  local me=$1 name=$2 env=$3 product=$4 slug=$5
  shift 5
  local override=${!env:-}
  if [[ -n "$override" ]]; then
    if [[ ! -f "$override" || ! -x "$override" ]]; then
      printf '%s\n' "$me: $env=$override is not an executable file (unset $env to search PATH and the usual places)" >&2
      exit 127
    fi
    tool=$override
    return 0
  fi
  tool=$(find_tool "$name" "$@") || true
  [[ -z "$tool" ]] || return 0
  local -a where=()
  local pattern
  for pattern in "$@"; do where+=("    ${pattern%/*}"); done
  # printf, a builtin: the message comes out even when PATH holds nothing.
  printf '%s\n' \
    "$me: $name was not found (the command-line tool of NVIDIA $product)." \
    "  looked on PATH (${PATH:-empty}) and in:" \
    "${where[@]}" \
    "  to get it: install NVIDIA $product (https://developer.nvidia.com/$slug):" \
    "  it comes with the CUDA toolkit installers, or as the $slug package" \
    "  from NVIDIA's CUDA repository (apt install $slug-<version> once the" \
    "  repository is set up); then put $name on PATH or set $env=/path/to/$name." >&2
  exit 127
}

# report_base NAME EXT PROGRAM OUTPUT: prints where the report goes, without
# its extension EXT: OUTPUT, else weft-NAME-<program>-<date-time>.
report_base() {
  local name=$1 ext=$2 program=$3 output=$4 stamp
  if [[ -z "$output" ]]; then
    printf -v stamp '%(%Y%m%d-%H%M%S)T' -1
    output="weft-$name-${program##*/}-$stamp"
  fi
  printf '%s\n' "${output%"$ext"}"
}
