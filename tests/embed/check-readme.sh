#!/usr/bin/env bash
# Builds and runs README.md's first C++ program against the installed package,
# as a reader would: the first ```cpp block becomes the main.cpp of an outside
# project (examples/embed's CMakeLists.txt: find_package(weft)), which
# check-embed.sh installs Weft for, builds, and runs on the threaded and the
# naive engine. Each run must exit 0 and print the line the block's
# `// prints: TEXT` comment gives. Fails when the README has no such block,
# the block has no `// prints:` line, or the block is not closed.
#   check-readme.sh README BUILD_DIR EMBED_SRC WORK_DIR
set -euo pipefail
readme=$1 build_dir=$2 embed_src=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work/project"
src="$work/project/main.cpp"

# A fence (CommonMark): up to three spaces, then three or more backticks or
# tildes; the info string's first word names the language. The block ends at a
# fence of the same character, at least as long, with nothing after it. Lines
# inside lose the opening fence's indentation. Exit status 3: no C++ block; 4:
# a C++ block that is never closed.
status=0
awk '
  function fence(line) {           # sets f_char, f_len, f_indent, f_info; 1 when line is a fence
    sub(/\r$/, "", line)
    match(line, /^ */); f_indent = RLENGTH
    if (f_indent > 3) return 0
    rest = substr(line, f_indent + 1); f_char = substr(rest, 1, 1)
    if (f_char == "`") match(rest, /^`+/); else if (f_char == "~") match(rest, /^~+/); else return 0
    f_len = RLENGTH
    if (f_len < 3) return 0
    f_info = substr(rest, f_len + 1); sub(/^[ \t]+/, "", f_info); sub(/[ \t].*$/, "", f_info)
    return 1
  }
  function closes(line) {
    if (!fence(line) || f_char != open_char || f_len < open_len) return 0
    tail = substr(line, f_indent + f_len + 1); sub(/\r$/, "", tail)
    return tail ~ /^[ \t]*$/
  }
  state == 0 {
    if (fence($0)) {
      open_char = f_char; open_len = f_len; open_indent = f_indent
      lang = tolower(f_info)
      state = (lang == "cpp" || lang == "c++" || lang == "cxx") ? 1 : 2
    }
    next
  }
  state == 2 { if (closes($0)) state = 0; next }
  state == 1 {
    if (closes($0)) { done = 1; exit }
    line = $0; sub(/\r$/, "", line)
    for (i = 0; i < open_indent && substr(line, 1, 1) == " "; i++) line = substr(line, 2)
    print line
  }
  END { if (!done) exit (state == 1 ? 4 : 3) }
' "$readme" > "$src" || status=$?
case $status in
  0) ;;
  3) echo "check-readme: $readme has no \`\`\`cpp block (its first one is the first program)" >&2; exit 1 ;;
  4) echo "check-readme: $readme: its first \`\`\`cpp block is never closed" >&2; exit 1 ;;
  *) echo "check-readme: reading $readme failed (awk exit $status)" >&2; exit 1 ;;
esac

expected=$(sed -n 's|^[[:space:]]*// prints: ||p' "$src" | head -n 1)
if [[ -z "$expected" ]]; then
  echo "check-readme: the first \`\`\`cpp block of $readme has no '// prints: TEXT' line saying what it prints" >&2
  exit 1
fi
echo "check-readme: the first program ($(wc -l < "$src") lines) should print: $expected"
cp "$embed_src/CMakeLists.txt" "$work/project/CMakeLists.txt"

if ! bash "$here/check-embed.sh" cmake "$build_dir" "$work/project" "$work/embed" | tee "$work/run.log"; then
  for log in configure build; do
    [[ -f "$work/embed/$log.log" ]] && { echo "--- $work/embed/$log.log (end)"; tail -n 40 "$work/embed/$log.log"; }
  done
  echo "check-readme: the first program of $readme did not build or run against the installed package" >&2
  exit 1
fi
runs=$(grep -cxF -- "$expected" "$work/run.log" || true)
if [[ "$runs" != 2 ]]; then
  echo "check-readme: '$expected' printed by $runs of the 2 runs (threaded, naive engine); see above" >&2
  exit 1
fi
echo "check-readme: the first program of $readme builds against the installed package and prints '$expected'"
