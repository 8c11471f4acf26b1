#!/usr/bin/env python3
"""The search's first choice against the clock: is what --plan-search ranks first the fastest?

For each scenario (a model, data, ranks and samples per step on this machine's CPU), runs
`fsdpx-train --plan-search --out DIR`, then measures a spread of the compositions it kept: its
first three, and those ranked at a quarter, a half and the end of its list, each run a few steps
(benchmarks/plan_vs_measured.py's measurement: the slowest rank's step, the median over the steps
after the first two). The candidates are measured in `--rounds` interleaved rounds and each keeps
its fastest round, so that the machine's drift between runs does not decide the order. A scenario
passes when the search's first choice measures within 5% of the fastest candidate measured.

This measures the candidates, not every composition the search kept: the fastest measured is the
fastest of those six.

Usage: benchmarks/search_vs_measured.py [--build build] [--only NAME,...] [--rounds 2] [--json FILE]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_vs_measured import run  # noqa: E402  (the same measurement)

SMALL = ["--model.name", "gpt", "--model.size", "small"]
TINY = ["--model.name", "gpt", "--model.size", "tiny"]
WIDE = ["--model.name", "gpt", "--model.size", "1b", "--model.layers", "2", "--model.seq", "128",
        "--data.name", "synthetic", "--data.seq", "128", "--batch-size", "4"]
T5 = ["--model.name", "t5", "--model.size", "small", "--data.name", "synthetic", "--data.seq", "64",
      "--data.vocab", "32000", "--batch-size", "4"]

# name, ranks, steps per measurement, arguments
SCENARIOS = [
    ("gpt tiny 2 ranks", 2, 30, TINY),
    ("gpt small 1 rank", 1, 10, SMALL),
    ("gpt small 2 ranks", 2, 10, SMALL),
    ("gpt 1b width 2 layers 2 ranks", 2, 4, WIDE),
    ("t5 small 2 ranks", 2, 6, T5),
]


def search(build, ranks, args, out):
    cmd = [os.path.join(build, "bin", "fsdpx-train"), "--plan-search", "--nproc-per-node", str(ranks),
           "--out", out] + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"--plan-search exited {r.returncode}:\n{r.stdout[-2000:]}")
    return json.load(open(os.path.join(out, "search.json")))


def candidates(fitting):
    n = len(fitting)
    picks = sorted({0, 1, 2, n // 4, n // 2, n - 1} & set(range(n)))
    return [(i, fitting[i]) for i in picks]


def scenario(build, name, ranks, steps, args, rounds, work):
    s = search(build, ranks, args, os.path.join(work, name.replace(" ", "_") + "_search"))
    chosen = candidates(s["fitting"])
    measured = {i: float("inf") for i, _ in chosen}
    for r in range(rounds):
        for i, f in chosen:
            _, _, step = run(build, f"{name} {i} {r}", ranks, steps, f["args"], work)
            measured[i] = min(measured[i], step)
    fastest = min(measured.values())
    rows = [{"rank": i + 1, "label": f["label"], "predicted_s": f["step_s"], "measured_s": measured[i]}
            for i, f in chosen]
    first = measured[chosen[0][0]] / fastest
    print(f"\n{name}: {s['planned']} planned of {s['compositions']}, {len(s['fitting'])} fit; "
          f"the first choice measures {first:.3f}x the fastest candidate: {'pass' if first <= 1.05 else 'FAIL'}")
    print(f"  {'rank':>4} {'predicted':>10} {'measured':>10} {'ratio':>6}  composition")
    for row in rows:
        print(f"  {row['rank']:4} {1e3 * row['predicted_s']:8.1f}ms {1e3 * row['measured_s']:8.1f}ms "
              f"{row['predicted_s'] / row['measured_s']:6.2f}  {row['label']}", flush=True)
    return {"name": name, "first_over_fastest": first, "candidates": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", default="", help="comma-separated names (substrings) of scenarios to run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of measurement")
    ap.add_argument("--json", default="", help="write every scenario's figures here")
    a = ap.parse_args()
    chosen = [c for c in SCENARIOS if not a.only or any(o in c[0] for o in a.only.split(","))]
    results, errors = [], []
    with tempfile.TemporaryDirectory() as work:
        for name, ranks, steps, args in chosen:
            try:
                results.append(scenario(a.build, name, ranks, steps, args, a.rounds, work))
            except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
                errors.append(f"{name}: {e}")
                print(f"{name}: failed: {str(e).splitlines()[0]}")
    passed = sum(r["first_over_fastest"] <= 1.05 for r in results)
    print(f"\n{passed} of {len(results)} scenarios: the search's first choice within 5% of the fastest measured")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
