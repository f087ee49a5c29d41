#!/usr/bin/env python3
"""Checks the bench summaries of scripts/ (allreduce-summary, engine-summary)
against hand-computed figures.

  check_bench_summary.py SCRIPTS NAME json EXPECTED.json INPUT...
      runs `NAME --json INPUT...` and compares it with EXPECTED.json as
      check_trace_summary.py does (keys starting with "_" are comments,
      floats within 1e-6).
  check_bench_summary.py SCRIPTS NAME errors FIXTURES
      a missing file, a line that is not JSON (a pretty-printed trace too), a
      file without the bench's rows, a row without its time (for
      allreduce-summary also a per-rep line without its predecessor) and an
      unknown option: exit status 2, a message naming the file (or option),
      nothing on stdout, no traceback.

Exits 1 with one line per mismatch. Standard library only.
"""
import os
import sys
import tempfile

from check_trace_summary import expect_json, expect_refusal, run


def check_json(script, expected_path, inputs):
    return expect_json(os.path.basename(script), run([script, "--json", *inputs]), expected_path)


# Per script: a row without its time, what it says of it, what it says of
# a file without its rows, and further refusals (file contents, the words).
ERROR_CASES = {
    "allreduce-summary": ('{"impl":"weft_mpi","ranks":2,"bytes":4}', "time_us",
                          ["has no rows", "mpirun"],
                          [('{"impl":"mpi","ranks":2,"bytes":4,"time_us":1.0}\n{"rep_of":"mpi","ranks":2,"bytes":4}\n',
                            ["per-rep line", "('after')"])]),
    "engine-summary": ('{"engine":"weft","shape":"chain","body":"empty"}', "ns_per_op",
                       ["has no weft-bench-engine rows"], []),
}


def check_errors(script, fixtures):
    no_time_row, no_time_word, no_rows_words, more = ERROR_CASES[os.path.basename(script)]
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        bad_json = os.path.join(tmp, "bad.jsonl")
        with open(bad_json, "w", encoding="utf-8") as f:
            f.write('{"impl":"mpi","ranks":2,"bytes":4,"time_us":1.0}\n{"impl": oops}\n')
        no_time = os.path.join(tmp, "no_time.jsonl")
        with open(no_time, "w", encoding="utf-8") as f:
            f.write(no_time_row + "\n")
        # Rows of neither bench's interest: an in-process ring row, a text line.
        other_rows = os.path.join(tmp, "other_rows.jsonl")
        with open(other_rows, "w", encoding="utf-8") as f:
            f.write('some text\n{"impl":"weft_ring","ranks":1,"bytes":4,"time_us":1.0}\n')
        cases = [
            ([os.path.join(tmp, "missing.jsonl")], ["missing.jsonl", "cannot read"]),
            ([bad_json], ["bad.jsonl:2", "not a JSON line"]),
            ([other_rows], ["other_rows.jsonl"] + no_rows_words),
            ([os.path.join(fixtures, "empty.json")], ["empty.json:1", "not a JSON line"]),
            ([no_time], ["no_time.jsonl:1", no_time_word]),
            (["--bogus", os.path.join(fixtures, "allreduce_run_a.jsonl")], ["unknown option --bogus"]),
        ]
        for k, (text, needles) in enumerate(more):
            path = os.path.join(tmp, f"more_{k}.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            cases.append(([path], [f"more_{k}.jsonl:2"] + needles))
        for args, needles in cases:
            expect_refusal([script, *args], " ".join(os.path.basename(a) for a in args), needles, errors)
    return errors


def main(argv):
    if len(argv) < 5 or argv[2] not in ERROR_CASES or argv[3] not in ("json", "errors"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    script = os.path.join(argv[1], argv[2])
    errors = check_json(script, argv[4], argv[5:]) if argv[3] == "json" else check_errors(script, argv[4])
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
