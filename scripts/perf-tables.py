#!/usr/bin/env python3
"""Markdown tables for docs/performance.md from one or two runs of the benchmark.

    scripts/perf-tables.py [--write docs/performance.md] RUN1.csv [RUN2.csv]

One table per operation (and key length for scores): the throughput of every implementation in
run 1, then for the first sdpa row (the active backend) its roof% and limit, its spread, its
ratio to the first peer (in run 1, and run 2 if given), and its ratio to the scalar backend.
Given two runs, how far the medians moved between them. With --write, the tables replace the
lines between the BEGIN and END markers in that file instead of being printed.
Python's standard library only.
"""
import contextlib
import csv
import io
import statistics
import sys

BEGIN = "<!-- perf-tables.py: begin (scripts/perf-docs --write regenerates) -->"
END = "<!-- perf-tables.py: end -->"

UNITS = {  # column shown, heading, larger is better
    "dot": ("gflops", "GFLOP/s", True),
    "scale": ("gbytes_per_s", "GB/s (read + write)", True),
    "softmax": ("ns_per_elem", "ns per element", False),
    "scores": ("gflops", "GFLOP/s", True),
    "to_f16": ("gbytes_per_s", "GB/s (read + write)", True),
    "from_f16": ("gbytes_per_s", "GB/s (read + write)", True),
    "attention": ("gflops", "GFLOP/s", True),
    "backward": ("gflops", "GFLOP/s", True),
}
SHAPED = ("attention", "backward")
L2_LEVELS = ("L1", "L2")


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def label(row):
    return row["impl"]


def group_key(row):
    return (row["op"], row["d"])


def fmt(value, column):
    v = float(value)
    if column == "ns_per_elem":
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return f"{v:.1f}"


def ratio(value):
    return f"{float(value):.2f}x" if value else "-"


def main(run1_path, run2_path=None):
    run1, run2 = load(run1_path), load(run2_path) if run2_path else []
    by_key2 = {(r["op"], r["d"], r["size"], r["impl"]): r for r in run2}
    groups = {}
    for r in run1:
        groups.setdefault(group_key(r), []).append(r)
    moved_l2, moved_beyond, ratio_moved = [], [], []
    for (op, d), rows in groups.items():
        column, unit, _ = UNITS[op]
        sizes = list(dict.fromkeys(r["size"] for r in rows))
        impls = list(dict.fromkeys(label(r) for r in rows if r["impl"] != "L1 loads"))
        lead = next(label(r) for r in rows if r["kind"] == "sdpa")
        peer = next((r["peer1"] for r in rows if r["peer1"]), "")
        title = f"{op} d{d}" if d != "0" else op
        print(f"### {title} ({unit})\n")
        vs_peer = f"{lead} vs {peer}" + (": run 1 / run 2" if run2 else "")
        head = ["shape" if op in SHAPED else "n"] + impls + [
            f"{lead} roof% (limit)", f"{lead} spread", vs_peer if peer else None,
            f"{lead} vs scalar"]
        head = [h for h in head if h is not None]
        print("| " + " | ".join(head) + " |")
        print("| " + " | ".join("---:" if i else "---" for i in range(len(head))) + " |")
        for size in sizes:
            at = {label(r): r for r in rows if r["size"] == size}
            cells = [size if op in SHAPED else size_label(size)]
            for impl in impls:
                r = at.get(impl)
                flag = " (!)" if r and r["check"] == "inaccurate" else ""
                cells.append(fmt(r[column], column) + flag if r else "")
            r = at[lead]
            cells.append(f"{float(r['roof_percent']):.0f} ({r['roof_limit']})" if r["roof_percent"] else "-")
            lo = 100 * (float(r["ns_min"]) / float(r["ns_median"]) - 1)
            hi = 100 * (float(r["ns_max"]) / float(r["ns_median"]) - 1)
            cells.append(f"{lo:+.0f}..{hi:+.0f} %")
            r2 = by_key2.get((op, d, size, lead))
            if peer and run2:
                cells.append(f"{ratio(r['vs_peer1'])} / {ratio(r2['vs_peer1']) if r2 else '-'}")
            elif peer:
                cells.append(ratio(r["vs_peer1"]))
            cells.append(ratio(r["vs_scalar"]))
            print("| " + " | ".join(cells) + " |")
            # reproducibility: every timed row of sdpa, and the lead's ratio to its peer
            for impl, row in at.items():
                other = by_key2.get((op, d, size, impl))
                if not other or row["kind"] != "sdpa":
                    continue
                moved = abs(float(other["ns_median"]) / float(row["ns_median"]) - 1)
                (moved_l2 if row["roof_limit"] in L2_LEVELS else moved_beyond).append(moved)
            if peer and r2 and r["vs_peer1"] and r2["vs_peer1"]:
                ratio_moved.append(abs(float(r2["vs_peer1"]) / float(r["vs_peer1"]) - 1))
        print()
    if not run2:
        return
    print("### Between the two runs\n")
    for name, moved in (("working set in L1 or L2", moved_l2), ("beyond L2", moved_beyond)):
        if moved:
            within = sum(m <= 0.10 for m in moved) / len(moved)
            print(f"- sdpa medians, {name}: moved by {100 * statistics.median(moved):.1f} % "
                  f"(median over {len(moved)} rows), {100 * within:.0f} % of rows within 10 %, "
                  f"largest {100 * max(moved):.0f} %.")
    if ratio_moved:
        within = sum(m <= 0.10 for m in ratio_moved) / len(ratio_moved)
        print(f"- the active backend's ratio to its first peer: moved by "
              f"{100 * statistics.median(ratio_moved):.1f} % (median over {len(ratio_moved)} rows), "
              f"{100 * within:.0f} % of rows within 10 %.")


def size_label(size):
    n = int(size)
    if n >= 16384 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return size


def write(path, runs):
    """Replaces the lines between BEGIN and END in path with the tables."""
    text = open(path).read()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        sys.exit(f"perf-tables.py: {path} needs one line {BEGIN!r} and one {END!r}")
    tables = io.StringIO()
    with contextlib.redirect_stdout(tables):
        main(*runs)
    head, rest = text.split(BEGIN)
    tail = rest.split(END)[1]
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n\n{tables.getvalue()}{END}{tail}")


if __name__ == "__main__":
    args = sys.argv[1:]
    target = None
    if args[:1] == ["--write"] and len(args) > 1:
        target, args = args[1], args[2:]
    if not 1 <= len(args) <= 2:
        sys.exit(__doc__)
    if target:
        write(target, args)
    else:
        main(*args)
