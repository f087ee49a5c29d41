#!/usr/bin/env bash
# Runs one demo at tiny sizes with --json and --trace, then checks what it
# promised: exit 0, a last line that is a JSON object with the demo's figures
# (and "hardware"), and a trace that is a Weft trace (schema 2) with spans.
# With WEFT_DEMO_EXPECT_BACKEND set, the JSON's gpu_backend must be that and
# the trace must have GPU tracks (the demo ran its GPU form).
# usage: run-demo.sh <demo binary> <scratch dir> <scripts dir> [demo args...]
set -euo pipefail
demo=$1 work=$2 scripts=$3
shift 3
rm -rf "$work"
mkdir -p "$work"
"$demo" "$@" --json --trace "$work/trace.json" > "$work/out.txt"
tail -n 1 "$work/out.txt" > "$work/figures.json"
python3 - "$work/figures.json" "$work/trace.json" <<'PY'
import json, sys
figures = json.load(open(sys.argv[1]))
assert isinstance(figures, dict), "the last line is not a JSON object"
assert "hardware" in figures or "tour" in figures, f"no hardware in {sorted(figures)}"
trace = json.load(open(sys.argv[2]))
assert trace["weft"]["schema"] == 2, "not a schema-2 Weft trace"
spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
assert spans, "the trace has no spans"
import os
backend = os.environ.get("WEFT_DEMO_EXPECT_BACKEND")
if backend:
    assert figures.get("gpu_backend") == backend, f"gpu_backend {figures.get('gpu_backend')!r}, expected {backend!r}"
    assert any(e.get("args", {}).get("device", "").startswith("gpu") or "gpu(" in str(e.get("args", {}))
               for e in spans) or any("gpu(" in json.dumps(e) for e in trace["traceEvents"][:200]), \
        "the trace shows no GPU track"
print(f"ok: {len(figures)} figures, {len(spans)} spans")
PY
# The trace reads back without a browser.
if [[ -x "$scripts/trace-summary" ]]; then
  "$scripts/trace-summary" "$work/trace.json" > "$work/summary.txt"
fi
