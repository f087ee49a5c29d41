#!/usr/bin/env bash
# Installs what is missing, builds Weft (Release) and runs the main demo.
# Usage: scripts/demo.sh [weft-demo arguments...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup-debian.sh
cmake --preset release > /dev/null
cmake --build --preset release --target weft-demo
./build/examples/weft-demo "$@"
