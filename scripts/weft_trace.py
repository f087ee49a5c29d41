"""Reading a Weft JSON trace (schema 2) and computing its summary.

Shared by scripts/trace-summary and scripts/trace-timeline. The figures are
docs/trace-format.md's, computed by the same rules as Profiler::summarize()
(engine/src/profiler_summary.cpp):

* the window runs from the earliest span start to the latest span end, over
  every track (launch tracks included);
* per resource (the tracks' "resource" key, grouped per device): ops (spans),
  busy time (sum of span durations), utilization = busy / (window * tracks),
  bytes (sum of the spans' args.bytes);
* compute and copy: the union of the compute (resp. copy) spans of the
  "worker" and "stream" tracks ("launch" tracks are the host side of stream
  spans and are not counted), their overlap, and the overlap efficiency
  both / min(compute, copy) (0 when either is 0);
* for each pair of devices with spans on worker/stream tracks: the same
  figures with each device's busy time (union of its spans).

Times in the file are microseconds with three decimals; they are turned
back into integer nanoseconds (as the engine recorded them) so that the
sums are exact. Standard library only.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

SCHEMA = 2
NOT_WEFT = f"not a Weft trace (schema {SCHEMA})"
TRACK_KINDS = ("worker", "launch", "stream")
COPY_PROPERTIES = frozenset({"copy_to_device", "copy_from_device", "copy_peer"})


class TraceError(Exception):
    """A trace that cannot be read: the message names the file and the problem."""


@dataclass
class Span:
    name: str
    cat: str  # "compute" or "copy"
    start_ns: int
    end_ns: int
    bytes: int = 0
    op_id: int | None = None
    op_property: str | None = None  # args.property
    shape: str | None = None  # args.shape: the op's cost-table key (GPU kernels pushed while profiling)

    @property
    def is_copy(self) -> bool:
        return self.cat == "copy"


@dataclass
class Track:
    pid: int
    tid: int
    device: str
    label: str
    kind: str  # "worker", "launch" or "stream"
    resource: str
    spans: list[Span] = field(default_factory=list)


@dataclass
class FlowPoint:
    pid: int
    tid: int
    ts_ns: int


@dataclass
class Flow:
    id: Any
    start: FlowPoint  # inside the unblocking op's span
    finish: FlowPoint  # start of the unblocked op's span


@dataclass
class Trace:
    source: str  # file name as given ("<stdin>" for -)
    tracks: list[Track]
    flows: list[Flow]
    orphan_spans: int = 0  # "X" events on no track of weft.tracks (ignored)


def to_ns(us: float) -> int:
    """Microseconds (three decimals in the file) to integer nanoseconds."""
    return round(us * 1000)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_json(path: str) -> tuple[str, Any]:
    """Parses the file (or stdin for "-"); returns (display name, document)."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.buffer.read().decode("utf-8")
        else:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
    except FileNotFoundError:
        raise TraceError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{name}: is a directory, not a trace file") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise TraceError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{name}: invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise TraceError(f"{name}: invalid JSON: nested too deeply") from None
    return name, doc


def parse(doc: Any, name: str) -> Trace:
    """Checks the schema and collects tracks, spans and flow arrows."""
    if not isinstance(doc, dict):
        raise TraceError(f"{name}: {NOT_WEFT}: the top level is not a JSON object")
    weft = doc.get("weft")
    if not isinstance(weft, dict):
        raise TraceError(f'{name}: {NOT_WEFT}: no "weft" object (a trace from an older Weft or another tool?)')
    schema = weft.get("schema")
    if schema != SCHEMA or isinstance(schema, bool):
        raise TraceError(f"{name}: {NOT_WEFT}: weft.schema is {json.dumps(schema)}")
    raw_tracks = weft.get("tracks")
    if not isinstance(raw_tracks, list):
        raise TraceError(f"{name}: malformed trace: weft.tracks is not a list")
    events = doc.get("traceEvents", [])
    if not isinstance(events, list):
        raise TraceError(f"{name}: malformed trace: traceEvents is not a list")

    tracks: list[Track] = []
    by_key: dict[tuple[int, int], Track] = {}
    for i, t in enumerate(raw_tracks):
        where = f"{name}: malformed trace: weft.tracks[{i}]"
        if not isinstance(t, dict):
            raise TraceError(f"{where} is not an object")
        for key in ("pid", "tid"):
            if not isinstance(t.get(key), int) or isinstance(t.get(key), bool):
                raise TraceError(f'{where}: "{key}" is missing or not an integer')
        for key in ("device", "label", "kind", "resource"):
            if not isinstance(t.get(key), str):
                raise TraceError(f'{where}: "{key}" is missing or not a string')
        if t["kind"] not in TRACK_KINDS:
            raise TraceError(f'{where}: unknown kind "{t["kind"]}" (expected one of {", ".join(TRACK_KINDS)})')
        track = Track(t["pid"], t["tid"], t["device"], t["label"], t["kind"], t["resource"])
        if (track.pid, track.tid) in by_key:
            raise TraceError(f"{where}: pid {track.pid}, tid {track.tid} listed twice")
        by_key[(track.pid, track.tid)] = track
        tracks.append(track)

    orphans = 0
    starts: dict[Any, FlowPoint] = {}
    finishes: dict[Any, FlowPoint] = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            continue
        ph = ev.get("ph")
        if ph not in ("X", "s", "f"):
            continue  # metadata, counters
        where = f"{name}: malformed trace: traceEvents[{i}]"
        for key in ("pid", "tid"):
            if not isinstance(ev.get(key), int) or isinstance(ev.get(key), bool):
                raise TraceError(f'{where} ("ph":"{ph}"): "{key}" is missing or not an integer')
        if not _is_number(ev.get("ts")):
            raise TraceError(f'{where} ("ph":"{ph}"): "ts" is missing or not a number')
        key = (ev["pid"], ev["tid"])
        if ph in ("s", "f"):
            fid = ev.get("id")
            if isinstance(fid, (int, str)) and not isinstance(fid, bool):
                point = FlowPoint(ev["pid"], ev["tid"], to_ns(ev["ts"]))
                (starts if ph == "s" else finishes)[fid] = point
            continue
        if not _is_number(ev.get("dur")):
            raise TraceError(f'{where} ("ph":"X"): "dur" is missing or not a number')
        if ev["dur"] < 0:
            raise TraceError(f'{where} ("ph":"X"): negative "dur" {ev["dur"]}')
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        nbytes = args.get("bytes", 0)
        if not _is_number(nbytes) or nbytes < 0:
            raise TraceError(f'{where} ("ph":"X"): args.bytes is not a non-negative number')
        prop = args.get("property") if isinstance(args.get("property"), str) else None
        cat = ev.get("cat")
        if cat not in ("compute", "copy"):  # not written by Weft; fall back on the property
            cat = "copy" if prop in COPY_PROPERTIES else "compute"
        start = to_ns(ev["ts"])
        span = Span(
            name=str(ev.get("name", "(unnamed)")),
            cat=cat,
            start_ns=start,
            end_ns=start + to_ns(ev["dur"]),
            bytes=int(nbytes),
            op_id=args.get("op_id") if isinstance(args.get("op_id"), int) else None,
            op_property=prop,
            shape=args.get("shape") if isinstance(args.get("shape"), str) else None,
        )
        track = by_key.get(key)
        if track is None:
            orphans += 1
        else:
            track.spans.append(span)
    for track in tracks:
        track.spans.sort(key=lambda s: (s.start_ns, s.end_ns))
    flows = [Flow(fid, starts[fid], finishes[fid]) for fid in starts if fid in finishes]
    return Trace(name, tracks, flows, orphans)


def load(path: str) -> Trace:
    """Reads and parses a trace file ("-": stdin); raises TraceError."""
    name, doc = read_json(path)
    return parse(doc, name)


# --- intervals -------------------------------------------------------------

Interval = tuple[int, int]


def merged(intervals: list[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time (empty ones dropped)."""
    out: list[list[int]] = []
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def length(intervals: list[Interval]) -> int:
    return sum(hi - lo for lo, hi in intervals)


def common(a: list[Interval], b: list[Interval]) -> int:
    """Time covered by both (each merged)."""
    total = 0
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(a: str, b: str, x: list[Interval], y: list[Interval]) -> dict[str, Any]:
    lx, ly, both = length(x), length(y), common(x, y)
    shorter = min(lx, ly)
    return {
        "a": a,
        "b": b,
        "a_ms": lx / 1e6,
        "b_ms": ly / 1e6,
        "both_ms": both / 1e6,
        "efficiency": both / shorter if shorter > 0 else 0.0,
    }


# --- the summary -----------------------------------------------------------


def window_ns(trace: Trace) -> tuple[int, int]:
    """(earliest span start, latest span end) over all tracks; (0, 0) without spans."""
    first = last = None
    for track in trace.tracks:
        for s in track.spans:
            first = s.start_ns if first is None else min(first, s.start_ns)
            last = s.end_ns if last is None else max(last, s.end_ns)
    return (0, 0) if first is None else (first, last)


def summarize(trace: Trace) -> dict[str, Any]:
    """The summary as one JSON-ready object (see trace-summary --help)."""
    first, last = window_ns(trace)
    window = last - first
    device_order: dict[str, int] = {}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    compute: list[Interval] = []
    copy: list[Interval] = []
    by_device: dict[str, list[Interval]] = {}
    for track in trace.tracks:
        device_order.setdefault(track.device, len(device_order))
        g = groups.setdefault(
            (track.device, track.resource),
            {"resource": track.resource, "device": track.device, "kind": track.kind,
             "tracks": 0, "ops": 0, "busy_ns": 0, "bytes": 0},
        )
        g["tracks"] += 1
        counts = track.kind != "launch"  # launches are the host side of stream spans
        if counts and track.spans:
            by_device.setdefault(track.device, [])
        for s in track.spans:
            g["ops"] += 1
            g["busy_ns"] += s.end_ns - s.start_ns
            g["bytes"] += s.bytes
            if counts:
                (copy if s.is_copy else compute).append((s.start_ns, s.end_ns))
                by_device[track.device].append((s.start_ns, s.end_ns))

    resources = []
    for (device, resource), g in sorted(groups.items(), key=lambda kv: (device_order[kv[0][0]], kv[0][1])):
        busy = g["busy_ns"]
        resources.append({
            "resource": resource,
            "device": device,
            "kind": g["kind"],
            "tracks": g["tracks"],
            "ops": g["ops"],
            "busy_ms": busy / 1e6,
            "utilization": busy / (window * g["tracks"]) if window > 0 else 0.0,
            "bytes": g["bytes"],
        })
    devices = sorted((name, merged(v)) for name, v in by_device.items())
    pairs = [
        overlap(devices[i][0], devices[j][0], devices[i][1], devices[j][1])
        for i in range(len(devices))
        for j in range(i + 1, len(devices))
    ]
    return {
        "window_ms": window / 1e6,
        "resources": resources,
        "compute_copy": overlap("compute", "copy", merged(compute), merged(copy)),
        "devices": pairs,
    }


def overlap_line(o: dict[str, Any]) -> str:
    """One overlap as the engine's summary prints it."""
    return (f"{o['a']} {o['a_ms']:.3f} ms, {o['b']} {o['b_ms']:.3f} ms, both {o['both_ms']:.3f} ms: "
            f"overlap efficiency {o['efficiency']:.2f}")


def format_table(summary: dict[str, Any]) -> str:
    """The summary as text, laid out as Profiler's ProfileSummary::table()."""
    resources = summary["resources"]
    w = max([8] + [len(r["resource"]) for r in resources])
    lines = [f"profiled window {summary['window_ms']:.3f} ms"]
    lines.append(f"{'resource':<{w}}  {'kind':>6}  {'tracks':>6}  {'ops':>9}  {'busy ms':>11}  "
                 f"{'util %':>6}  {'bytes':>12}  {'GB/s':>7}")
    for r in resources:
        rate = f"{r['bytes'] / (r['busy_ms'] * 1e6):.3f}" if r["bytes"] > 0 and r["busy_ms"] > 0 else "-"
        lines.append(f"{r['resource']:<{w}}  {r['kind']:>6}  {r['tracks']:>6}  {r['ops']:>9}  "
                     f"{r['busy_ms']:>11.3f}  {100.0 * r['utilization']:>6.1f}  {r['bytes']:>12}  {rate:>7}")
    lines.append("overlap of compute and copies (union of spans; launch tracks not counted):")
    lines.append("  " + overlap_line(summary["compute_copy"]))
    if summary["devices"]:
        lines.append("overlap between devices:")
    lines.extend("  " + overlap_line(o) for o in summary["devices"])
    return "\n".join(lines) + "\n"
