# Sourced by profile-nsys.sh and profile-ncu.sh (bash built-ins only, so it
# works with an empty PATH).
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
