#!/usr/bin/env python3
"""Checks scripts/trace-summary against hand-computed figures.

  check_trace_summary.py SCRIPTS json  TRACE EXPECTED.json [--stdin]
      runs `trace-summary --json TRACE` (or `--json -` with TRACE on stdin)
      and compares every field with EXPECTED.json: same keys (EXPECTED's
      keys starting with "_" are comments), same list lengths and order,
      strings and integers equal, floats within 1e-6.
  check_trace_summary.py SCRIPTS text  TRACE EXPECTED.txt
      compares the text table with EXPECTED.txt exactly.
  check_trace_summary.py SCRIPTS errors FIXTURES
      a missing file, invalid JSON, a trace without the "weft" object, a
      wrong schema and a malformed track: exit status 2, a message naming
      the file and the problem, nothing on stdout, no traceback.

Exits 1 with one line per mismatch. Standard library only.
"""

import json
import os
import subprocess
import sys
import tempfile

TOLERANCE = 1e-6


def run(cmd, stdin=None):
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=50)


def compare(actual, expected, path, errors):
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            errors.append(f"{path}: expected an object, got {json.dumps(actual)}")
            return
        want = {k for k in expected if not k.startswith("_")}
        if set(actual) != want:
            errors.append(f"{path}: keys {sorted(actual)}, expected {sorted(want)}")
        for k in sorted(want & set(actual)):
            compare(actual[k], expected[k], f"{path}.{k}", errors)
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            errors.append(f"{path}: expected a list of {len(expected)}, got {json.dumps(actual)}")
            return
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, f"{path}[{i}]", errors)
    elif isinstance(expected, bool) or isinstance(expected, str):
        if actual != expected or type(actual) is not type(expected):
            errors.append(f"{path}: {json.dumps(actual)}, expected {json.dumps(expected)}")
    elif isinstance(expected, int):
        if isinstance(actual, bool) or not isinstance(actual, int) or actual != expected:
            errors.append(f"{path}: {json.dumps(actual)}, expected the integer {expected}")
    elif isinstance(expected, float):
        if isinstance(actual, bool) or not isinstance(actual, (int, float)) or abs(actual - expected) > TOLERANCE:
            errors.append(f"{path}: {json.dumps(actual)}, expected {expected!r} (tolerance {TOLERANCE})")
    else:
        errors.append(f"{path}: unexpected value in the expected file: {expected!r}")


def expect_json(name, p, expected_path):
    """A finished `NAME --json` run against EXPECTED.json: its mismatches."""
    with open(expected_path, encoding="utf-8") as f:
        expected = json.load(f)
    if p.returncode != 0:
        return [f"{name} --json exited {p.returncode}: {p.stderr.strip()}"]
    try:
        actual = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        return [f"{name} --json printed invalid JSON ({e}): {p.stdout[:200]!r}"]
    errors = []
    compare(actual, expected, "$", errors)
    return errors


def check_json(script, trace, expected_path, use_stdin):
    if use_stdin:
        with open(trace, encoding="utf-8") as f:
            p = run([script, "--json", "-"], stdin=f.read())
    else:
        p = run([script, "--json", trace])
    return expect_json("trace-summary", p, expected_path)


def check_text(script, trace, expected_path):
    with open(expected_path, encoding="utf-8") as f:
        expected = f.read()
    p = run([script, trace])
    if p.returncode != 0:
        return [f"trace-summary exited {p.returncode}: {p.stderr.strip()}"]
    if p.stdout == expected:
        return []
    errors = ["the table differs from " + expected_path]
    got, want = p.stdout.splitlines(), expected.splitlines()
    for i in range(max(len(got), len(want))):
        g = got[i] if i < len(got) else "<missing>"
        w = want[i] if i < len(want) else "<missing>"
        if g != w:
            errors.append(f"  line {i + 1}: got      {g!r}")
            errors.append(f"  line {i + 1}: expected {w!r}")
    return errors


def expect_failure(script, path, needles, errors, stdin=None):
    shown = "<stdin>" if path == "-" else path
    expect_refusal([script, path], shown, [shown] + needles, errors, stdin)


def expect_refusal(cmd, shown, needles, errors, stdin=None):
    """CMD exits 2 with a message holding every needle, nothing on stdout, no traceback."""
    p = run(cmd, stdin=stdin)
    if p.returncode != 2:
        errors.append(f"{shown}: exit status {p.returncode}, expected 2 (stderr: {p.stderr.strip()!r})")
    if p.stdout:
        errors.append(f"{shown}: printed on stdout: {p.stdout[:200]!r}")
    if "Traceback" in p.stderr:
        errors.append(f"{shown}: a Python traceback instead of a message: {p.stderr.strip()}")
    for needle in needles:
        if needle not in p.stderr:
            errors.append(f"{shown}: the message {p.stderr.strip()!r} does not mention {needle!r}")


def check_errors(script, fixtures):
    errors = []
    expect_failure(script, os.path.join(fixtures, "no-such-trace.json"), ["no such file"], errors)
    expect_failure(script, os.path.join(fixtures, "not_weft.json"),
                   ["not a Weft trace (schema 2)", '"weft"'], errors)
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "truncated.json": ('{"displayTimeUnit":"ns","weft":{"schema":2,', ["invalid JSON"]),
            "garbage.json": ("this is not JSON\n", ["invalid JSON"]),
            "array.json": ("[1, 2, 3]\n", ["not a Weft trace (schema 2)"]),
            "schema3.json": ('{"weft":{"schema":3,"tracks":[]},"traceEvents":[]}',
                             ["not a Weft trace (schema 2)", "weft.schema is 3"]),
            "badkind.json": ('{"weft":{"schema":2,"tracks":[{"pid":1,"tid":1,"device":"cpu(0)",'
                             '"label":"worker 0","kind":"bogus","resource":"cpu(0) workers"}]},'
                             '"traceEvents":[]}', ["weft.tracks[0]", "bogus"]),
        }
        for name, (text, needles) in cases.items():
            path = os.path.join(tmp, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            expect_failure(script, path, needles, errors)
        expect_failure(script, "-", ["invalid JSON"], errors, stdin="{")
    return errors


def main(argv):
    if len(argv) < 3 or argv[1] not in ("json", "text", "errors"):
        print(__doc__, file=sys.stderr)
        return 2
    script = os.path.join(argv[0], "trace-summary")
    if not os.access(script, os.X_OK):
        print(f"FAIL: {script} is missing or not executable", file=sys.stderr)
        return 1
    mode = argv[1]
    if mode == "json" and len(argv) in (4, 5):
        errors = check_json(script, argv[2], argv[3], len(argv) == 5 and argv[4] == "--stdin")
    elif mode == "text" and len(argv) == 4:
        errors = check_text(script, argv[2], argv[3])
    elif mode == "errors" and len(argv) == 3:
        errors = check_errors(script, argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errors:
        print("FAIL: " + e, file=sys.stderr)
    if errors:
        return 1
    print(f"ok: trace-summary {' '.join(argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
