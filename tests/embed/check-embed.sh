#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then configures, builds and
# runs examples/embed against it as an outside project would.
set -euo pipefail
build_dir=$1 embed_src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$embed_src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log"
cmake --build "$work/build" -j 2 > "$work/build.log"
test -f "$work/prefix/include/weft/engine.h"
"$work/build/embed"
WEFT_ENGINE=naive "$work/build/embed"
