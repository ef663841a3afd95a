#!/usr/bin/env python3
"""Summarise a torch profiler Chrome trace (dpo-train's DPO_TRAIN_PROFILE, or torch.profiler's
export_chrome_trace) in text: the window's wall time, how much of it the host spends inside torch
operators and how much between them (the caller's own overhead), the operators by self time, and on
CUDA the kernels' busy time, launches and synchronisations, and the share of kernel time in matrix
products, in attention and in everything else.

    python3 tools/trace_summary.py trace.json[.gz] [--steps N] [--top 25] [--by-op] [--first-shapes]
"""

import argparse
import collections
import gzip
import json


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def union_length(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def self_times(ops):
    """Per-name (count, total, self) of nested host operators on one thread."""
    stats = collections.defaultdict(lambda: [0, 0.0, 0.0])
    stack = []  # [end, name, duration, children's time]
    top = []

    def close(until):
        while stack and stack[-1][0] <= until:
            end, name, dur, child = stack.pop()
            stats[name][2] += dur - child

    for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
        close(e["ts"])
        stats[e["name"]][0] += 1
        stats[e["name"]][1] += e["dur"]
        if stack:
            stack[-1][3] += e["dur"]
        else:
            top.append((e["ts"], e["ts"] + e["dur"]))
        stack.append([e["ts"] + e["dur"], e["name"], e["dur"], 0.0])
    close(float("inf"))
    return stats, top


def kind(name):
    """A kernel's kind by its name: cuBLAS/cuBLASLt/CUTLASS products (`gemm`, Hopper's `nvjet`),
    fused attention (flash, memory-efficient `fmha`, cuDNN's), or other (elementwise, reductions,
    copies)."""
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "cudnn" in n:
        return "attention"
    if "gemm" in n or "nvjet" in n:
        return "matrix products"
    return "other"


def by_op(ev, n, top):
    """Kernel time a step by the operator that launched each kernel and that operator's input
    shapes and dtypes (the `External id` a kernel shares with its `cpu_op`)."""
    ops = {e["args"].get("External id"): e for e in ev if e.get("cat") == "cpu_op"}
    acc = collections.defaultdict(lambda: [0, 0.0])
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            op = ops.get(e["args"].get("External id"))
            key = "?" if op is None else f"{op['name']} {op['args'].get('Input Dims')} {op['args'].get('Input type')}"
            acc[key[:160]][0] += 1
            acc[key[:160]][1] += e["dur"]
    print("kernel time by launching operator and shapes (a step):")
    for key, (count, dur) in sorted(acc.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {dur / 1000 / n:8.2f} ms  {count / n:7.1f}x  {key}")


def first_shapes(ev, n):
    """Host time of matrix products (`aten::mm`, `addmm`, `bmm`) on a shape the trace had not shown
    before, against repeated ones: cuBLAS chooses a kernel for each new shape on the host."""
    products = sorted((e for e in ev if e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::addmm", "aten::bmm")),
                      key=lambda e: e["ts"])
    seen, first, again = set(), [], []
    for e in products:
        key = (e["name"], str(e["args"].get("Input Dims")), str(e["args"].get("Input Strides")),
               str(e["args"].get("Input type")))
        (again if key in seen else first).append(e["dur"])
        seen.add(key)
    for name, durs in (("first-seen shapes", first), ("repeated shapes", again)):
        if durs:
            median = sorted(durs)[len(durs) // 2]
            print(f"{name}: {len(durs)} products ({len(durs) / n:.1f} a step), host {sum(durs) / 1000:.1f} ms, "
                  f"median {median:.0f} us, mean {sum(durs) / len(durs):.0f} us")
    slow = sorted(d for d in first if d > 1000)
    if slow:
        print(f"  first-seen above 1 ms: {len(slow)}, {slow[0] / 1000:.1f}-{slow[-1] / 1000:.1f} ms "
              f"(median {slow[len(slow) // 2] / 1000:.1f} ms), {sum(slow) / 1000:.1f} ms in all")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps in the trace (for per-step figures)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--by-op", action="store_true", help="kernel time by launching operator and shapes")
    p.add_argument("--first-shapes", action="store_true", help="host time of products on first-seen shapes")
    a = p.parse_args()
    ev = [e for e in load(a.trace) if e.get("ph") == "X"]
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    if not ops:
        raise SystemExit(f"{a.trace}: no cpu_op events")
    threads = collections.Counter(e["tid"] for e in ops)
    main_tid = threads.most_common(1)[0][0]
    mine = [e for e in ops if e["tid"] == main_tid]
    start = min(e["ts"] for e in mine)
    end = max(e["ts"] + e["dur"] for e in mine)
    wall = end - start
    stats, top = self_times(mine)
    inside = union_length(top)
    ms = lambda us: us / 1000.0
    n = a.steps
    print(f"window {ms(wall):.1f} ms over {n} steps = {ms(wall) / n:.1f} ms a step (main thread {main_tid}; "
          f"{len(threads)} threads ran operators)")
    print(f"host: inside torch operators {ms(inside):.1f} ms ({100 * inside / wall:.0f}%), between them "
          f"{ms(wall - inside):.1f} ms ({100 * (wall - inside) / wall:.0f}%); {len(mine)} operator calls "
          f"({len(mine) / n:.0f} a step)")
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    if kernels:
        busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
        print(f"GPU: kernels busy {ms(busy):.1f} ms ({100 * busy / wall:.0f}% of the window), "
              f"{len(kernels)} kernels ({len(kernels) / n:.0f} a step), mean {sum(e['dur'] for e in kernels) / len(kernels):.1f} us")
        total = sum(e["dur"] for e in kernels)
        shares = collections.Counter(kind(e["name"]) for e in kernels)
        time_of = collections.Counter()
        for e in kernels:
            time_of[kind(e["name"])] += e["dur"]
        print("kernel time by kind: " + ", ".join(
            f"{k} {100 * time_of[k] / total:.0f}% ({ms(time_of[k]) / n:.1f} ms, {shares[k] / n:.0f} kernels a step)"
            for k in ("matrix products", "attention", "other") if shares[k]))
        runtime = collections.defaultdict(lambda: [0, 0.0])
        for e in ev:
            if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
                runtime[e["name"]][0] += 1
                runtime[e["name"]][1] += e["dur"]
        print("CUDA runtime calls by total time:")
        for name, (count, dur) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:10]:
            print(f"  {ms(dur):9.1f} ms  {count:7d}x  {name}")
        kstats = collections.defaultdict(lambda: [0, 0.0])
        for e in kernels:
            kstats[e["name"][:90]][0] += 1
            kstats[e["name"][:90]][1] += e["dur"]
        print("kernels by total time:")
        for name, (count, dur) in sorted(kstats.items(), key=lambda kv: -kv[1][1])[: a.top]:
            print(f"  {ms(dur):9.1f} ms  {count:7d}x  {name}")
    print("host operators by self time (main thread):")
    for name, (count, total, own) in sorted(stats.items(), key=lambda kv: -kv[1][2])[: a.top]:
        print(f"  {ms(own):9.1f} ms self  {ms(total):9.1f} ms total  {count:7d}x  {name}")
    if a.by_op:
        by_op(ev, n, a.top)
    if a.first_shapes:
        first_shapes(ev, n)


if __name__ == "__main__":
    main()
