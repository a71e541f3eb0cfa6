#!/usr/bin/env python3
"""The SASS instructions where a kernel's warps stall most, from Nsight Compute's source page.

device_check.sh's `hotspots` stage profiles one kernel launch with the SourceCounters section
(warp-state sampling) and exports the source page as CSV (`ncu -i REPORT --page source --csv
--print-source sass`); this script reads that CSV and prints the instructions with the most
stall samples, each with its share of all samples and the instruction text, and the samples
summed per instruction kind (the opcode before the first space or dot).

    python3 bench/probes/stall_hotspots.py source.csv [--top 40]
"""
import argparse
import csv
import gzip
import sys
from collections import Counter


def read_rows(path):
    """The source page's rows as dicts keyed by column (path: the CSV, or it gzipped)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="", errors="replace") as f:
        lines = f.read().splitlines()
    # skip ncu's preamble lines up to the header (the first line naming the source column)
    start = next((i for i, line in enumerate(lines) if '"Source"' in line or line.startswith("Source")), None)
    if start is None:
        sys.exit(f"{path}: no source-page header found")
    return list(csv.DictReader(lines[start:]))


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = read_rows(args.csv)
    if not rows:
        sys.exit("no rows")
    columns = list(rows[0].keys())
    samples_col = next((c for c in columns if c.startswith("Warp Stall Sampling (All")), None)
    address_col = next((c for c in columns if "Address" in c), columns[0])
    if samples_col is None:
        sys.exit("no 'Warp Stall Sampling (All Samples)' column; columns: " + ", ".join(columns))
    total = sum(number(r[samples_col]) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} samples")
    ranked = sorted(rows, key=lambda r: number(r[samples_col]), reverse=True)
    for r in ranked[: args.top]:
        share = 100.0 * number(r[samples_col]) / total
        print(f"{share:5.1f}%  {r[address_col]:>8}  {r['Source'].strip()}")
    kinds = Counter()
    for r in rows:
        words = r["Source"].split() or [""]
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]  # past a predicate
        kinds[op.split(".")[0]] += number(r[samples_col])
    print("per opcode:", ", ".join(f"{k} {100.0 * v / total:.1f}%" for k, v in kinds.most_common(15)))


if __name__ == "__main__":
    main()
