#!/usr/bin/env bash
# Installs what is missing (Fashion-MNIST included), builds weft-train-lenet
# and trains LeNet on Fashion-MNIST: 10 epochs, batch 256, on cpu:0 unless
# told otherwise. Arguments go to weft-train-lenet (see --help), e.g.
#   scripts/train-lenet.sh --device gpu:0 --json
set -euo pipefail
if [[ "${1:-}" == "-h" ]]; then
  sed -n '2,5p' "$0" | sed 's/^# //'
  exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup-debian.sh
cmake --preset release > /dev/null
cmake --build --preset release -j "$(nproc)" --target weft-train-lenet
exec build/examples/weft-train-lenet "$@"
