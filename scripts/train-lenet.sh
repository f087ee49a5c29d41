#!/usr/bin/env bash
# Installs what is missing (Fashion-MNIST included), builds the trainer this
# script is named for (train-lenet.sh: weft-train-lenet; train-resnet.sh, a
# link to this file: weft-train-resnet) and runs it: 10 epochs, batch 256,
# on cpu:0 unless told otherwise. Arguments go to the trainer (see --help), e.g.
#   scripts/train-lenet.sh --device gpu:0 --json
#   scripts/train-resnet.sh --limit 2048 --epochs 2 --batch-size 128
set -euo pipefail
if [[ "${1:-}" == "-h" ]]; then
  sed -n '2,7p' "$0" | sed 's/^# //'
  exit 0
fi
trainer="weft-$(basename "$0" .sh)"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup-debian.sh
cmake --preset release > /dev/null
cmake --build --preset release -j "$(nproc)" --target "$trainer"
exec "build/examples/$trainer" "$@"
