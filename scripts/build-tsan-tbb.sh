#!/usr/bin/env bash
# Builds a ThreadSanitizer-instrumented oneTBB from Debian's source package and
# installs it into a private prefix for Weft's `tsan` preset. Run with --help.
set -euo pipefail

readonly SCRIPT_NAME=${0##*/}
REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly REPO_ROOT
readonly SRC_PACKAGE=onetbb
# Bump when the build recipe below changes, so old installs are rebuilt.
readonly RECIPE=1
readonly STAMP_NAME=.weft-tbb-tsan.stamp
readonly OWNER_NAME=.weft-tbb-tsan.owner
readonly DEB_SRC_FILE=/etc/apt/sources.list.d/weft-deb-src.sources

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME [--force] [PREFIX]

Builds oneTBB with ThreadSanitizer (-fsanitize=thread) from Debian's source
package '$SRC_PACKAGE' (Debian patches applied) and installs it into PREFIX.
Weft's 'tsan' preset then finds it with find_package(TBB 2021 CONFIG) when
PREFIX is on CMAKE_PREFIX_PATH. Debian's own libtbb is not instrumented and
makes TSan report false races inside TBB.

  PREFIX   install prefix (default: <repo>/.deps/tbb-tsan, i.e.
           $REPO_ROOT/.deps/tbb-tsan).
           Gets include/, lib/libtbb.so*, lib/cmake/TBB/TBBConfig.cmake.
           The script owns PREFIX: a rebuild deletes it first. It refuses a
           non-empty PREFIX that it did not create.
  --force  rebuild even if PREFIX already holds a matching build.
  -h, --help  show this text.

Steps (each skipped when not needed):
  1. As root (sudo if available): install dpkg-dev, cmake and g++ when
     missing; enable Debian source indexes by writing
     $DEB_SRC_FILE
     ('Types: deb-src' copies of this release's entries in the existing apt
     sources; the original files are not edited) and run 'apt-get update'.
  2. 'apt-get source $SRC_PACKAGE' into <repo>/.deps/src/.
  3. CMake build (RelWithDebInfo, TBB_SANITIZE=thread; no tests, no
     tbbmalloc, no hwloc/tbbbind, so the result is the same on every
     machine) and install into PREFIX; write PREFIX/$STAMP_NAME.
  The build is skipped if the stamp matches: same Debian source version
  (the newest apt knows about, or WEFT_TBB_DEB_VERSION), same compiler, same
  recipe. Re-running is cheap and needs no network.

Environment:
  CXX, CC               compiler to build with (default g++ / gcc); use the
                        same one as the Weft build. A different compiler
                        means a rebuild.
  WEFT_TBB_DEB_VERSION  Debian source version to build (default: newest
                        available, e.g. 2021.8.0-2+deb12u1 on Debian 12).
  JOBS                  parallel build jobs (default: nproc).

Using it:
  cmake --preset tsan -DCMAKE_PREFIX_PATH=<PREFIX>   (or set it in the preset)
  Programs linked against this libtbb must be built with -fsanitize=thread:
  libtbb.so needs the TSan runtime. CMake records the full library path, so
  binaries in the build tree get an RPATH to PREFIX/lib and do not need
  LD_LIBRARY_PATH; installed binaries (RPATH stripped) would pick up the
  system libtbb instead.
EOF
}

log() { printf '==> %s\n' "$*" >&2; }
die() { printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2; exit 1; }

as_root() {
  if [[ $EUID -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root for: $* (run as root, or install sudo)"
  fi
}

# ---------------------------------------------------------------- arguments
force=0
prefix=
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --force) force=1 ;;
    --) shift; [[ $# -gt 0 ]] && { prefix=$1; shift; }; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [[ -z $prefix ]] || die "more than one PREFIX given"; prefix=$1 ;;
  esac
  shift
done
[[ $# -eq 0 ]] || die "unexpected arguments: $*"
prefix=${prefix:-$REPO_ROOT/.deps/tbb-tsan}
prefix=$(realpath -m -- "$prefix")
[[ $prefix != / ]] || die "refusing to use / as the prefix"

readonly WORK_DIR=$REPO_ROOT/.deps/src
jobs=${JOBS:-$(nproc)}
start_time=$SECONDS

# ---------------------------------------------------------------- compiler
cxx=${CXX:-g++}
cc=${CC:-gcc}

# ---------------------------------------------------------------- apt helpers
apt_updated=0
apt_update() {
  if [[ $apt_updated -eq 0 ]]; then
    log "apt-get update"
    as_root apt-get update -q
    apt_updated=1
  fi
}

# Prints the Debian source versions of $SRC_PACKAGE that apt knows about
# (nothing if no deb-src index is available). Never touches the network.
known_source_versions() {
  apt-cache showsrc --only-source "$SRC_PACKAGE" 2>/dev/null |
    awk '/^Version:/ { print $2 }' || true
}

newest_version() {
  local best='' v
  while read -r v; do
    [[ -n $v ]] || continue
    if [[ -z $best ]] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
  done
  printf '%s\n' "$best"
}

# Writes $DEB_SRC_FILE: a deb-src twin of every enabled 'deb' entry for this
# Debian release (suite = codename or codename-*), from deb822 *.sources files
# and one-line *.list files. URIs, suites, components and options are copied.
write_deb_src_file() {
  local codename='' tmp
  if [[ -r /etc/os-release ]]; then
    # shellcheck disable=SC1091
    codename=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
  fi
  tmp=$(mktemp)
  {
    printf '# Written by Weft %s: source indexes for apt-get source.\n' "scripts/$SCRIPT_NAME"
    printf '# Mirrors the Types: deb entries of the files next to it; safe to delete.\n\n'
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -f $f && $f != "$DEB_SRC_FILE" ]] || continue
      awk -v codename="$codename" '
        function flush(   i, n, s, keep, out, fld) {
          if (nlines == 0) return
          # Types must contain "deb" but not already "deb-src"; Enabled != no.
          n = split(types, s, /[ \t]+/); keep = 0
          for (i = 1; i <= n; i++) { if (s[i] == "deb") keep = 1; if (s[i] == "deb-src") keep = 0 }
          if (tolower(enabled) == "no") keep = 0
          out = ""
          if (keep) {
            n = split(suites, s, /[ \t]+/)
            for (i = 1; i <= n; i++)
              if (s[i] != "" && (codename == "" || s[i] == codename || index(s[i], codename "-") == 1))
                out = out (out == "" ? "" : " ") s[i]
            if (out == "") keep = 0
          }
          if (keep) {
            print "Types: deb-src"
            for (i = 1; i <= nlines; i++) {
              fld = tolower(lines[i]); sub(/:.*/, "", fld)
              if (lines[i] ~ /^[ \t]/) { if (!skipcont[i]) print lines[i]; continue }
              if (fld == "types" || fld == "enabled") continue
              if (fld == "suites") { print "Suites: " out; continue }
              print lines[i]
            }
            print ""
          }
          nlines = 0; types = ""; suites = ""; enabled = ""
        }
        /^#/ { next }
        /^[ \t]*$/ { flush(); next }
        {
          lines[++nlines] = $0; skipcont[nlines] = 0
          if ($0 ~ /^[ \t]/) { skipcont[nlines] = lastskip; next }
          fld = tolower($0); sub(/:.*/, "", fld)
          val = $0; sub(/^[^:]*:[ \t]*/, "", val)
          lastskip = (fld == "types" || fld == "enabled" || fld == "suites")
          if (fld == "types") types = val
          else if (fld == "suites") suites = val
          else if (fld == "enabled") enabled = val
        }
        END { flush() }
      ' "$f"
    done
    # One-line format: 'deb [opts] URI SUITE COMPONENTS...'.
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -f $f ]] || continue
      awk -v codename="$codename" '
        $1 != "deb" { next }
        {
          i = 2
          if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
          opts = ""; for (j = 2; j < i; j++) opts = opts " " $j
          uri = $i; suite = $(i + 1); comps = ""
          for (j = i + 2; j <= NF; j++) comps = comps " " $j
          if (uri ~ /^cdrom:/) next
          if (codename != "" && suite != codename && index(suite, codename "-") != 1) next
          printf "Types: deb-src\nURIs: %s\nSuites: %s\n", uri, suite
          if (comps != "") printf "Components:%s\n", comps
          if (opts != "") {
            gsub(/[][]/, "", opts); n = split(opts, o, /[ \t]+/)
            for (k = 1; k <= n; k++) {
              if (o[k] == "" || index(o[k], "=") == 0) continue
              key = substr(o[k], 1, index(o[k], "=") - 1); v = substr(o[k], index(o[k], "=") + 1)
              if (key == "signed-by") printf "Signed-By: %s\n", v
              else if (key == "arch") printf "Architectures: %s\n", v
              else if (key == "trusted") printf "Trusted: %s\n", v
            }
          }
          print ""
        }
      ' "$f"
    done
  } >"$tmp"
  if ! grep -q '^Types: deb-src' "$tmp"; then
    rm -f "$tmp"
    die "found no 'deb' entries for '${codename:-this release}' in /etc/apt to copy as deb-src"
  fi
  log "enabling Debian source indexes: $DEB_SRC_FILE"
  as_root install -m 0644 "$tmp" "$DEB_SRC_FILE"
  rm -f "$tmp"
}

# True if some enabled apt source has Types: deb-src (downloaded or not).
deb_src_configured() {
  # shellcheck disable=SC2016 # $(CREATED_BY) is apt's field syntax
  apt-get indextargets --no-release-info --format '$(CREATED_BY)' 2>/dev/null | grep -qx Sources
}

ensure_tools() {
  local pkgs=()
  command -v dpkg-source >/dev/null 2>&1 || pkgs+=(dpkg-dev)
  command -v cmake >/dev/null 2>&1 || pkgs+=(cmake)
  if ! command -v ninja >/dev/null 2>&1 && ! command -v make >/dev/null 2>&1; then pkgs+=(make); fi
  if ! command -v "$cxx" >/dev/null 2>&1; then
    [[ $cxx == g++ ]] || die "compiler CXX=$cxx not found"
    pkgs+=(g++)
  fi
  if ! command -v "$cc" >/dev/null 2>&1; then
    [[ $cc == gcc ]] || die "compiler CC=$cc not found"
    pkgs+=(gcc)
  fi
  if [[ ${#pkgs[@]} -gt 0 ]]; then
    apt_update
    log "installing: ${pkgs[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"
  fi
}

# ---------------------------------------------------------------- stamp
# Everything that decides whether an existing install can be reused.
stamp_text() {  # $1 = Debian source version
  local cxx_path cxx_ver
  cxx_path=$(command -v "$cxx" 2>/dev/null || printf '%s' "$cxx")
  # First line of --version minus argv[0], so g++ and g++-12 compare equal.
  cxx_ver=$("$cxx" --version 2>/dev/null | head -n1 | sed 's/^[^ ]* //' || true)
  printf 'package=%s\nversion=%s\nsanitize=thread\nbuild_type=RelWithDebInfo\ncxx=%s\ncxx_version=%s\nrecipe=%s\n' \
    "$SRC_PACKAGE" "$1" "$(realpath -- "$cxx_path" 2>/dev/null || printf '%s' "$cxx_path")" "$cxx_ver" "$RECIPE"
}

installed_ok() {  # $1 = wanted version
  [[ -f $prefix/$STAMP_NAME && -f $prefix/lib/cmake/TBB/TBBConfig.cmake ]] || return 1
  command -v "$cxx" >/dev/null 2>&1 || return 1
  [[ $(<"$prefix/$STAMP_NAME") == "$(stamp_text "$1")" ]]
}

# ---------------------------------------------------------------- main
# Fast path: no network, no root. The wanted version is WEFT_TBB_DEB_VERSION,
# else the newest source apt already knows; with no source index at all the
# existing stamp's version is accepted.
if [[ $force -eq 0 && -f $prefix/$STAMP_NAME ]]; then
  want=${WEFT_TBB_DEB_VERSION:-$(known_source_versions | newest_version)}
  [[ -n $want ]] || want=$(sed -n 's/^version=//p' "$prefix/$STAMP_NAME")
  if installed_ok "$want"; then
    log "up to date: TSan oneTBB $want in $prefix (use --force to rebuild)"
    exit 0
  fi
fi

# Source index first (no tools needed to write it), so that a fresh machine
# gets a single apt-get update for both the tools and the sources.
need_index=0
if [[ -z $(known_source_versions) ]]; then
  need_index=1
  deb_src_configured || write_deb_src_file
fi
ensure_tools
if [[ $need_index -eq 1 ]]; then
  apt_update
  [[ -n $(known_source_versions) ]] ||
    die "apt knows no source package '$SRC_PACKAGE' even after enabling deb-src and apt-get update"
fi
version=${WEFT_TBB_DEB_VERSION:-$(known_source_versions | newest_version)}
known_source_versions | grep -qxF -- "$version" ||
  die "Debian source '$SRC_PACKAGE' version '$version' is not available (apt knows: $(known_source_versions | tr '\n' ' '))"

if [[ $force -eq 0 ]] && installed_ok "$version"; then
  log "up to date: TSan oneTBB $version in $prefix (use --force to rebuild)"
  exit 0
fi

# The prefix is ours to wipe only if we created it (owner marker) or it is empty.
if [[ -e $prefix ]]; then
  [[ -d $prefix ]] || die "prefix $prefix exists and is not a directory"
  if [[ ! -f $prefix/$OWNER_NAME ]] && [[ -n $(ls -A -- "$prefix") ]]; then
    die "prefix $prefix is not empty and was not made by this script; pick another or empty it"
  fi
fi

# Fresh source tree per Debian version: several revisions unpack into the
# same onetbb-<upstream> directory name.
src_root=$WORK_DIR/${SRC_PACKAGE}_${version//:/_}
log "fetching Debian source $SRC_PACKAGE=$version into $src_root"
rm -rf -- "$src_root"
mkdir -p -- "$src_root"
apt_opts=()
# As root apt cannot hand the download to its '_apt' sandbox user (it may not
# write here) and warns; say explicitly that root downloads.
[[ $EUID -ne 0 ]] || apt_opts=(-o APT::Sandbox::User=root)
(cd -- "$src_root" && apt-get source -q "${apt_opts[@]}" --only-source "$SRC_PACKAGE=$version")
src_dir=$(find "$src_root" -mindepth 1 -maxdepth 1 -type d -name "$SRC_PACKAGE-*" | head -n1)
[[ -n $src_dir && -f $src_dir/CMakeLists.txt ]] || die "no unpacked source tree in $src_root"
if [[ -f $src_dir/debian/patches/series ]]; then
  log "Debian patches applied: $(grep -cvE '^[[:space:]]*(#|$)' "$src_dir/debian/patches/series")"
fi

build_dir=$src_root/build
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
# GCC warns (-Wtsan) at every std::atomic_thread_fence in TBB: TSan does not
# model fences. Known and harmless here (no false reports from TBB), so keep
# the log readable. Clang has no -Wtsan (it would warn about the flag).
cxx_flags=
if ! "$cxx" -dM -E -x c++ /dev/null 2>/dev/null | grep -q __clang__; then cxx_flags=-Wno-tsan; fi
log "configuring with $cxx: $(stamp_text "$version" | sed -n 's/^cxx_version=//p')"
cmake -S "$src_dir" -B "$build_dir" "${generator[@]}" --no-warn-unused-cli \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$cxx_flags" \
  -DCMAKE_INSTALL_MESSAGE=NEVER \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_LIBDIR=lib \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DBUILD_SHARED_LIBS=ON \
  -DTBB_SANITIZE=thread \
  -DTBB_TEST=OFF \
  -DTBB_EXAMPLES=OFF \
  -DTBB4PY_BUILD=OFF \
  -DTBBMALLOC_BUILD=OFF \
  -DTBB_STRICT=OFF \
  -DTBB_DISABLE_HWLOC_AUTOMATIC_SEARCH=ON
log "building with $jobs jobs"
cmake --build "$build_dir" --parallel "$jobs"

log "installing into $prefix"
rm -rf -- "$prefix"
mkdir -p -- "$prefix"
: >"$prefix/$OWNER_NAME"
cmake --install "$build_dir"
[[ -f $prefix/lib/cmake/TBB/TBBConfig.cmake ]] || die "install produced no $prefix/lib/cmake/TBB/TBBConfig.cmake"
stamp_text "$version" >"$prefix/$STAMP_NAME"

log "done in $((SECONDS - start_time)) s: TSan oneTBB $version in $prefix"
log "use: -DCMAKE_PREFIX_PATH=$prefix (TBBConfig.cmake: $prefix/lib/cmake/TBB)"
