#!/usr/bin/env bash
# Workers forked from the launcher (the default) against workers started by exec
# (FSDPX_EXEC_WORKERS=1), side by side, alternating: the wall time and the CPU time (launcher and
# workers) of a short run of fsdpx-train at 2 ranks (the default gpt, 4 steps), median of ROUNDS.
# Usage: benchmarks/worker_start.sh [BUILD] [ROUNDS]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-5}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "worker_start.sh: ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2; }
python3 - "$BUILD/bin/fsdpx-train" "$ROUNDS" <<'PY'
import os, resource, shutil, statistics, subprocess, sys, tempfile, time
train, rounds = sys.argv[1], int(sys.argv[2])
work = tempfile.mkdtemp()
def run(exec_workers):
    env = dict(os.environ, FSDPX_EXEC_WORKERS="1" if exec_workers else "0")
    out = os.path.join(work, "run")
    shutil.rmtree(out, ignore_errors=True)
    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([train, "--nproc-per-node", "2", "--steps", "4", "--batch-size", "8", "--log-every", "4",
                    "--peak-tflops", "1", "--out", out], env=env, check=True, stdout=subprocess.DEVNULL)
    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
figures = {False: [], True: []}
try:
    for _ in range(rounds):
        for mode in (False, True):
            figures[mode].append(run(mode))
finally:
    shutil.rmtree(work, ignore_errors=True)
med = {m: (statistics.median(w for w, _ in f), statistics.median(c for _, c in f)) for m, f in figures.items()}
for m, name in ((False, "forked"), (True, "exec'd")):
    print(f"2-rank 4-step run, workers {name}: {med[m][0]:.2f} s wall, {med[m][1]:.2f} CPU-s (median of {rounds})")
print(f"forked/exec'd: wall x{med[False][0] / med[True][0]:.2f}, CPU x{med[False][1] / med[True][1]:.2f}; "
      f"{(med[True][1] - med[False][1]) / 2:.2f} CPU-s saved per worker")
PY
