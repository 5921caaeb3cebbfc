#!/usr/bin/env bash
# Times `summon load` over a generated project of N recipe files (default 1000) plus agents.
# Prints the median and best wall time of RUNS runs; the target is under 50 ms for 1000.
#   benches/load.sh [N] [RUNS]
set -euo pipefail
n=${1:-1000}
runs=${2:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --quiet --manifest-path "$root/Cargo.toml" --bin summon
bin="$root/target/release/summon"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/recipes" "$work/.agents/agents"
python3 - "$work" "$n" <<'PY'
import sys, os
work, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    body = "\n".join(f"  Step {j}: inspect part {j} of {{{{ target }}}} and report." for j in range(40))
    with open(os.path.join(work, "recipes", f"recipe-{i:05}.yaml"), "w") as f:
        f.write(f"""version: 1.0.0
title: Recipe {i}
description: Generated recipe number {i} for the load benchmark
instructions: |
{body}
prompt: Work on {{{{ target }}}} with depth {{{{ depth }}}}.
parameters:
  - key: target
    input_type: string
    requirement: required
    description: What to work on
  - key: depth
    input_type: select
    requirement: optional
    default: normal
    options: [quick, normal, deep]
    description: How deep
extensions:
  - type: builtin
    name: developer
    timeout: 300
""")
for i in range(n // 10):
    with open(os.path.join(work, ".agents", "agents", f"agent-{i:04}.md"), "w") as f:
        f.write(f"---\nname: agent-{i:04}\ndescription: Generated agent {i}: reviews things\ntools: Read, Grep, Bash(git log*)\nmodel: inherit\n---\n\n" + "You review code carefully.\n" * 30)
PY
cd "$work"
"$bin" load > /dev/null  # warm the page cache
python3 - "$bin" "$runs" "$n" <<'PY'
import subprocess, sys, time, statistics
bin, runs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(runs):
    t = time.perf_counter()
    subprocess.run([bin, "load"], stdout=subprocess.DEVNULL, check=True)
    times.append((time.perf_counter() - t) * 1000)
listed = subprocess.run([bin, "load", "--json"], capture_output=True, check=True).stdout.count(b'"name"')
print(f"| files | sources listed | runs | median ms | best ms | target ms |")
print(f"|---|---|---|---|---|---|")
print(f"| {n} recipes + {n // 10} agents | {listed} | {runs} | {statistics.median(times):.1f} | {min(times):.1f} | 50 |")
PY
