"""Summarizes `scripts/device_check.sh ab`: for each prefill point, the best TFLOP/s of each
FLASHATTN_KERNEL value over its rounds, and the last value's over the first's.

    python3 bench/probes/ab_summary.py ab.log
"""
import re
import sys


def read(path):
    runs = {}  # kernel -> point -> [TFLOP/s per round]
    kernel = None
    for line in open(path):
        header = re.match(r"== FLASHATTN_KERNEL=(\S+), round \d", line)
        if header:
            kernel = header.group(1).rstrip(",")
            runs.setdefault(kernel, {})
            continue
        cols = line.split()
        if kernel and cols and cols[0] == "prefill":
            point = (int(cols[6]), int(cols[2]), cols[7])  # head dim, seqlen, causal
            runs[kernel].setdefault(point, []).append(float(cols[9]))
    return runs


def main():
    runs = read(sys.argv[1])
    kernels = list(runs)
    if len(kernels) < 2:
        print("need two FLASHATTN_KERNEL values, got", kernels)
        return 1
    first, last = kernels[0], kernels[-1]
    print(f"d seqlen causal | {first} | {last} | ratio (best of rounds)")
    ratios = []
    for point, a in runs[first].items():
        b = runs[last].get(point)
        if not b:
            continue
        ratios.append(max(b) / max(a))
        print(f"{point[0]:3} {point[1]:6} {point[2]:3} | {max(a):7.1f} | {max(b):7.1f} | {ratios[-1]:.3f}")
    print(f"ratio range {min(ratios):.3f}-{max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
