#!/usr/bin/env python3
"""Warp-state samples of one kernel summed over phases of its SASS, from the source-page CSV of
device_check.sh's `hotspots` stage (hotspots-N.csv.gz).

A phase is a range of instruction indices (rows of the CSV in address order); the boundaries are
read off the SASS (stall_hotspots.py lists it with the markers: USETMAXREG, the turn barriers,
WARPGROUP.DEPBAR, STSM, EXIT). Prints, per phase, its share of all samples and its largest stall
reasons, and with --record appends a bench/results row per phase.

    python3 bench/probes/stall_phases.py hotspots-1.csv.gz 112,1600,1688,3240 setup,first_S,softmax \\
        [--case TEXT] [--record bench/results/hotspots-warpspec-h200.json]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stall_hotspots import number, read_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("bounds", help="instruction indices b0,b1,...: phase k is [b_k, b_k+1)")
    ap.add_argument("names", help="one name per phase")
    ap.add_argument("--case", default="")
    ap.add_argument("--record", help="a bench/results JSON to append the phases to")
    args = ap.parse_args()
    data = read_rows(args.csv)
    samples = "Warp Stall Sampling (All Samples)"
    reasons = [h for h in data[0] if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(number(r[samples]) for r in data) or 1.0
    bounds = [int(b) for b in args.bounds.split(",")]
    names = args.names.split(",")
    assert len(names) == len(bounds) - 1, "one name per phase"
    out = []
    for name, a, b in zip(names, bounds, bounds[1:]):
        share = 100.0 * sum(number(r[samples]) for r in data[a:b]) / total
        by_reason = sorted(((100.0 * sum(number(r[x]) for r in data[a:b]) / total, x[6:]) for x in reasons),
                           reverse=True)[:3]
        top = ", ".join(f"{reason} {pct:.1f}" for pct, reason in by_reason)
        print(f"{name:16s} [{a:5d}, {b:5d})  {share:5.1f}%  {top}")
        out.append({"kind": "hotspots", "case": args.case, "phase": name, "instructions": f"[{a}, {b})",
                    "samples_pct": round(share, 1), "top_stalls_pct": top})
    if args.record:
        try:
            with open(args.record) as f:
                record = json.load(f)
        except FileNotFoundError:
            record = {"device": "NVIDIA H200", "rows": []}
        record["rows"] += out
        with open(args.record, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
