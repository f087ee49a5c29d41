#!/usr/bin/env python3
"""Checks scripts/trace-timeline on a fixture trace.

  check_trace_timeline.py SCRIPTS TRACE SPANS FLOWS

Draws TRACE with and without --flows, parses each SVG with xml.etree and
checks: SPANS span rectangles (class "span ..."), as many as the trace's
"X" events, their compute/copy classes matching the events' categories,
one lane per track of weft.tracks labelled "device label" in order, the
title, FLOWS arrows with --flows and none without, and the legend's overlap
efficiency equal to trace-summary's. Also: a missing trace gives exit
status 2 and writes no SVG. Exits 1 with one line per mismatch.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def classes(el):
    return el.get("class", "").split()


def text_of(el):
    return "".join(el.itertext())


def check_svg(path, trace_doc, want_spans, want_flows, title, summary, errors, tag):
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        errors.append(f"{tag}: {path} is not well-formed XML: {e}")
        return
    if root.tag != SVG + "svg":
        errors.append(f"{tag}: the root element is {root.tag}, expected an svg element")
    x_events = [e for e in trace_doc["traceEvents"] if e.get("ph") == "X"]
    rects = [r for r in root.iter(SVG + "rect") if "span" in classes(r)]
    if len(rects) != want_spans or len(rects) != len(x_events):
        errors.append(f"{tag}: {len(rects)} span rectangles, expected {want_spans} "
                      f"(the trace has {len(x_events)} spans)")
    for cat in ("compute", "copy"):
        n_rects = sum(1 for r in rects if cat in classes(r))
        n_events = sum(1 for e in x_events if e.get("cat") == cat)
        if n_rects != n_events:
            errors.append(f"{tag}: {n_rects} {cat} rectangles for {n_events} {cat} spans")
    for r in rects:
        try:
            x, w = float(r.get("x")), float(r.get("width"))
            if not (math.isfinite(x) and math.isfinite(w) and w > 0):
                raise ValueError
        except (TypeError, ValueError):
            errors.append(f"{tag}: span rectangle with x={r.get('x')!r} width={r.get('width')!r}")
            break
    tracks = trace_doc["weft"]["tracks"]
    want_labels = [f"{t['device']} {t['label']}" for t in tracks]
    labels = [text_of(t) for t in root.iter(SVG + "text") if "lane-label" in classes(t)]
    if labels != want_labels:
        errors.append(f"{tag}: lane labels {labels}, expected {want_labels}")
    lanes = [g for g in root.iter(SVG + "g") if "lane" in classes(g)]
    if len(lanes) != len(tracks):
        errors.append(f"{tag}: {len(lanes)} lanes for {len(tracks)} tracks")
    # A lane holds exactly its track's spans.
    for g, t in zip(lanes, tracks):
        n = sum(1 for r in g.iter(SVG + "rect") if "span" in classes(r))
        want = sum(1 for e in x_events if e.get("pid") == t["pid"] and e.get("tid") == t["tid"])
        if n != want:
            errors.append(f"{tag}: lane {t['device']} {t['label']} has {n} spans, expected {want}")
    flows = [p for p in root.iter(SVG + "path") if "flow" in classes(p)]
    if len(flows) != want_flows:
        errors.append(f"{tag}: {len(flows)} flow arrows, expected {want_flows}")
    titles = [text_of(t) for t in root.iter(SVG + "text") if "title" in classes(t)]
    if titles != [title]:
        errors.append(f"{tag}: title {titles}, expected [{title!r}]")
    legend = " ".join(text_of(t) for t in root.iter(SVG + "text") if "overlap" in classes(t))
    eff = f"overlap efficiency {summary['compute_copy']['efficiency']:.2f}"
    if eff not in legend:
        errors.append(f"{tag}: legend {legend!r} does not say {eff!r} (trace-summary's figure)")


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    scripts, trace, want_spans, want_flows = argv[0], argv[1], int(argv[2]), int(argv[3])
    timeline = os.path.join(scripts, "trace-timeline")
    summary_script = os.path.join(scripts, "trace-summary")
    with open(trace, encoding="utf-8") as f:
        doc = json.load(f)
    errors = []
    p = subprocess.run([summary_script, "--json", trace], capture_output=True, text=True, timeout=50)
    if p.returncode != 0:
        print(f"FAIL: trace-summary exited {p.returncode}: {p.stderr.strip()}", file=sys.stderr)
        return 1
    summary = json.loads(p.stdout)
    title = 'timeline <check> & "quotes"'
    with tempfile.TemporaryDirectory() as tmp:
        for flows in (True, False):
            out = os.path.join(tmp, f"timeline-{flows}.svg")
            cmd = [timeline, trace, out, "--width", "900", "--title", title] + (["--flows"] if flows else [])
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
            tag = "trace-timeline" + (" --flows" if flows else "")
            if p.returncode != 0:
                errors.append(f"{tag}: exit status {p.returncode}: {p.stderr.strip()}")
                continue
            check_svg(out, doc, want_spans, want_flows if flows else 0, title, summary, errors, tag)
        missing = os.path.join(tmp, "no-such-trace.json")
        out = os.path.join(tmp, "missing.svg")
        p = subprocess.run([timeline, missing, out], capture_output=True, text=True, timeout=50)
        if p.returncode != 2 or missing not in p.stderr or "no such file" not in p.stderr:
            errors.append(f"missing trace: exit status {p.returncode}, stderr {p.stderr.strip()!r} "
                          "(expected 2 and a message naming the file)")
        if os.path.exists(out):
            errors.append("missing trace: an SVG was written anyway")
    for e in errors:
        print("FAIL: " + e, file=sys.stderr)
    if errors:
        return 1
    print(f"ok: trace-timeline {trace}: {want_spans} spans, {want_flows} arrows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
