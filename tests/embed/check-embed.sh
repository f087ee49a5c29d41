#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs an
# outside project against it as a user would: examples/embed with CMake
# (find_package(weft)), or its main.cpp with plain c++ and pkg-config.
#   check-embed.sh cmake|pkg-config BUILD_DIR EMBED_SRC WORK_DIR
set -euo pipefail
mode=$1 build_dir=$2 embed_src=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/include/weft/engine.h"
case "$mode" in
  cmake)
    cmake -S "$embed_src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
      > "$work/configure.log"
    cmake --build "$work/build" -j 2 > "$work/build.log"
    app="$work/build/embed"
    ;;
  pkg-config)
    pc=$(find "$work/prefix" -name weft.pc -path '*/pkgconfig/*' | head -n 1)
    test -n "$pc" || { echo "check-embed: no weft.pc under $work/prefix" >&2; exit 1; }
    export PKG_CONFIG_PATH="$(dirname "$pc")"
    flags=$(pkg-config --cflags --libs weft)
    echo "pkg-config --cflags --libs weft: $flags"
    # shellcheck disable=SC2086  # the flags are words
    c++ -O2 "$embed_src/main.cpp" -o "$work/embed" $flags
    app="$work/embed"
    ;;
  *) echo "check-embed: mode must be cmake or pkg-config, not '$mode'" >&2; exit 2 ;;
esac
"$app"
WEFT_ENGINE=naive "$app"
