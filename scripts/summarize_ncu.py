#!/usr/bin/env python3
"""One markdown table per Nsight Compute CSV (--csv --page details) written by
scripts/profile_decode.sh: per kernel launch its duration, grid, registers,
achieved occupancy, DRAM and SM throughput, issue activity, and the largest
warp stall reasons (cycles per issued instruction) when they were collected.

  summarize_ncu.py FILE.csv...
"""
import csv
import re
import sys

COLUMNS = [  # (header, metric name in the details page)
    ("us", "Duration"),
    ("grid", None),
    ("regs", "Registers Per Thread"),
    ("occ %", "Achieved Occupancy"),
    ("DRAM %", "DRAM Throughput"),
    ("mem %", "Memory Throughput"),
    ("SM %", "Compute (SM) Throughput"),
    ("cyc/issue", "Warp Cycles Per Issued Instruction"),
]
STALL = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio")


def launches(path):
    """[(kernel name, grid, {metric: (value, unit)})] in launch order."""
    rows = {}
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # skip the profiler's and the program's own output
    for r in csv.DictReader(lines):
        key = r.get("ID")
        if key is None or "Metric Name" not in r:
            continue
        name = r.get("Kernel Name", "?")
        ent = rows.setdefault(key, (name, r.get("Grid Size", ""), {}))
        ent[2][r["Metric Name"]] = (r.get("Metric Value", ""), r.get("Metric Unit", ""))
    return [rows[k] for k in sorted(rows, key=lambda k: int(k) if k.isdigit() else 0)]


def as_us(value, unit):
    try:
        v = float(value.replace(",", ""))
    except ValueError:
        return value
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
    return f"{v * scale:.2f}"


def short(name):
    name = re.sub(r"\(.*", "", name)  # drop the parameter list
    return name.replace("ikv::cuda::", "").replace("(anonymous namespace)::", "")[:70]


def main(paths):
    for path in paths:
        print(f"\n### {path.split('/')[-1]}\n")
        print("| kernel | " + " | ".join(h for h, _ in COLUMNS) + " | top stalls (cycles per issue) |")
        print("|---" * (len(COLUMNS) + 2) + "|")
        for name, grid, m in launches(path):
            cells = []
            for h, metric in COLUMNS:
                if metric is None:
                    cells.append(grid)
                elif metric == "Duration" and metric in m:
                    cells.append(as_us(*m[metric]))
                else:
                    cells.append(m.get(metric, ("", ""))[0])
            stalls = []
            for metric, (v, _) in m.items():
                s = STALL.match(metric)
                if s:
                    try:
                        stalls.append((float(v), s.group(1)))
                    except ValueError:
                        pass
            stalls.sort(reverse=True)
            top = ", ".join(f"{n} {v:.1f}" for v, n in stalls[:4])
            print(f"| {short(name)} | " + " | ".join(cells) + f" | {top} |")


if __name__ == "__main__":
    main(sys.argv[1:])
