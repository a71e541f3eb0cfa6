#!/usr/bin/env python3
"""Summarizes device_check.sh's `profile` log (Nsight Compute on the warpspec kernel, one
section per dtype) as a bench/results record: per dtype the kernel's duration under ncu's clock
control, how busy the tensor, XU (exp2), ALU and FMA pipes and the issue slots were, and the
stall reasons per issued instruction, largest first.

    python3 bench/probes/profile_summary.py profile.log --out bench/results/profile-warpspec-h200.json \\
        [--note TEXT]
"""
import argparse
import json
import re
import subprocess

METRICS = {  # record field: the ncu line's name
    "duration_ms": "Duration",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "xu_pipe_pct": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "alu_pipe_pct": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "fma_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "issue_slots_busy_pct": "Issue Slots Busy",
    "no_eligible_pct": "No Eligible",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+\S*\s*([0-9.]+)$")
TOP_STALLS = 6


def parse(log_text):
    rows, row, stalls = [], None, {}
    for line in log_text.splitlines():
        if line.startswith("== "):
            if row:
                rows.append(finish(row, stalls))
            parts = line[3:].split(" ", 1)
            row, stalls = {"kind": "profile", "dtype": parts[0], "args": parts[1] if len(parts) > 1 else ""}, {}
            continue
        if row is None:
            continue
        text = line.strip()
        for field, name in METRICS.items():
            if field not in row and re.match(re.escape(name) + r"\s", text):
                row[field] = float(text.split()[-1])
        m = STALL.search(text)
        if m and m.group(1) != "selected":  # "selected" is the issue itself, 1 per instruction
            stalls[m.group(1)] = float(m.group(2))
    if row:
        rows.append(finish(row, stalls))
    return rows


def finish(row, stalls):
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS]
    row["stalls_per_issue"] = ", ".join(f"{k} {v:.2f}" for k, v in top)
    return row


def gpu_name():
    """The first GPU's name as nvidia-smi gives it, or "unknown GPU" without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout
        return out.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None, help="the GPU's name (default: asked of nvidia-smi)")
    ap.add_argument("--note")
    args = ap.parse_args()
    with open(args.log) as f:
        rows = parse(f.read())
    if not rows:
        raise SystemExit(f"no profile sections in {args.log}")
    record = {"device": args.device or gpu_name(), "rows": rows}
    if args.note:
        record["note"] = args.note
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    for r in rows:
        print({k: v for k, v in r.items() if k != "args"})


if __name__ == "__main__":
    main()
