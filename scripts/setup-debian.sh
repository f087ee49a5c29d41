#!/usr/bin/env bash
# Installs what Weft needs from Debian 12's packages, only what is missing.
# Usage: scripts/setup-debian.sh [--with-starpu]   (run as root)
# Also writes weft-train-gpt's default text, /usr/local/share/weft/kjv.txt
# (the King James Bible from bible-kjv's `bible` program), when it is missing.
set -euo pipefail
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,3p' "$0" | sed 's/^# //'
  exit 0
fi
packages=(g++ cmake ninja-build pkg-config git
          libtbb-dev libboost-fiber-dev doctest-dev libopenblas-dev
          libopenmpi-dev openmpi-bin nlohmann-json3-dev zlib1g-dev dataset-fashion-mnist bible-kjv)
[[ "${1:-}" == "--with-starpu" ]] && packages+=(libstarpu-dev)

sudo_cmd=()
[[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "weft setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

# The byte-level corpus of weft-train-gpt (weft::default_text_corpus): all of
# the King James text, about 4.3 MB. Written to a temporary name and renamed,
# so an interrupted run leaves no partial file behind.
corpus=/usr/local/share/weft/kjv.txt
if [[ ! -s "$corpus" ]]; then
  echo "weft setup: writing $corpus from bible-kjv"
  "${sudo_cmd[@]}" mkdir -p "$(dirname "$corpus")"
  tmp=$(mktemp)
  bible "Gen1:1-Rev22:21" > "$tmp"
  if [[ ! -s "$tmp" ]]; then
    rm -f "$tmp"
    echo "weft setup: bible \"Gen1:1-Rev22:21\" printed nothing; $corpus not written" >&2
    exit 1
  fi
  "${sudo_cmd[@]}" install -m 0644 "$tmp" "$corpus.partial"
  "${sudo_cmd[@]}" mv -f "$corpus.partial" "$corpus"
  rm -f "$tmp"
fi
