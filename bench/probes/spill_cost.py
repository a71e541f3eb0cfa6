"""What the register spills cost (docs/DECISIONS.md D-49): Nsight Compute's count of local-memory
instructions and sectors of each kernel that ptxas reports spilling, against all its
instructions and its global loads, on one representative CLI call each.

    python3 bench/probes/spill_cost.py --cli .carry/prefix/bin/flashattn --out DIR   (on the GPU)

Writes DIR/spills-<case>.csv (ncu's raw records) and prints one line per kernel.
"""
import argparse
import csv
import os
import subprocess

METRICS = [
    "gpu__time_duration.sum",
    "smsp__sass_inst_executed.sum",
    "smsp__sass_inst_executed_op_local_ld.sum",
    "smsp__sass_inst_executed_op_local_st.sum",
    "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_hit.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
]
DECODE = "--kvcache --seqlen-q 1 --seqlen-k 16384 --repeat 2"
# (case, FLASHATTN_KERNEL, CLI run arguments): the spilling kernels of D-49 on calls that choose them.
CASES = [
    ("warpspec-d128-causal", "warpspec",
     "--seqlen-q 4096 --batch 4 --heads 16 --head-dim 128 --causal --repeat 2"),
    ("warpspec-d256-causal", "warpspec",
     "--seqlen-q 4096 --batch 4 --heads 8 --head-dim 256 --causal --repeat 2"),
    ("wgmma-narrow-d128-varlen", "wgmma,tile=narrow",
     "--varlen --seqlen-q 4096 --batch 4 --heads 16 --head-dim 128 --repeat 2"),
    ("persistent-d128-page16", "persistent", f"{DECODE} --batch 32 --heads 32 --kv-heads 8 --page-size 16"),
    ("splitkeys-d256-page16", "splitkeys",
     f"{DECODE} --batch 8 --heads 16 --kv-heads 4 --head-dim 256 --page-size 16"),
    ("splitkeys-d256-e4m3-page16", "splitkeys",
     f"{DECODE} --kv-dtype e4m3 --batch 8 --heads 16 --kv-heads 4 --head-dim 256 --page-size 16"),
]


def summarize(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    if not rows:
        return ["no kernel profiled"]
    head, rows = rows[0], rows[1:]
    k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    kernels = {}
    for r in rows:
        kernels.setdefault(r[k][:70], {})[r[m]] = float(r[v].replace(",", ""))
    lines = []
    for name, x in kernels.items():
        local = x["smsp__sass_inst_executed_op_local_ld.sum"] + x["smsp__sass_inst_executed_op_local_st.sum"]
        total = x["smsp__sass_inst_executed.sum"]
        sectors = x["l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"]
        hits = x["l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_hit.sum"]
        lines.append(f"{name}: {x['gpu__time_duration.sum'] / 1e3:.1f} us; local ld+st {local:.0f} of {total:.0f} "
                     f"warp instructions ({100 * local / total:.3f}%); local load sectors {sectors:.0f} "
                     f"(L1 hits {100 * hits / sectors if sectors else 100:.1f}%) against "
                     f"{x['l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum']:.0f} global load sectors")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    failed = 0
    for case, kernel, run_args in CASES:
        path = os.path.join(args.out, f"spills-{case}.csv")
        cmd = ["ncu", "--csv", "--print-units", "base", "-k", "regex:wgmma|warpspec|persistent|splitkeys|fwd_kernel",
               "-c", "2", "--metrics", ",".join(METRICS), args.cli, "run", *run_args.split()]
        with open(path, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, FLASHATTN_KERNEL=kernel)).returncode
        print(f"== {case} (FLASHATTN_KERNEL={kernel}){'' if rc == 0 else f' ncu exit {rc}'}")
        failed += rc != 0
        for line in summarize(path):
            print("  " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
