#!/usr/bin/env bash
# Installs what Weft needs from Debian 12's packages, only what is missing.
# Usage: scripts/setup-debian.sh [--with-starpu]   (run as root)
set -euo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,3p' "$0" | sed 's/^# //'
  exit 0
fi
packages=(g++ cmake ninja-build pkg-config git
          libtbb-dev libboost-fiber-dev doctest-dev libopenblas-dev
          libopenmpi-dev openmpi-bin nlohmann-json3-dev zlib1g-dev dataset-fashion-mnist)
[[ "${1:-}" == "--with-starpu" ]] && packages+=(libstarpu-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "weft setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
