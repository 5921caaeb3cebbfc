#!/usr/bin/env python3
"""Runs summon's reliability suite and prints one table of figures.

    benches/reliability.py [--fuzz-seconds S] [--no-fuzz] [--json]

Runs, with `SUMMON_FIGURES` pointing at a temporary file that the tests append JSON lines to:

- `cargo test --test faults`: 1,000-task fan-outs at 5/10/20 % injected faults, fail-fast cases
- `cargo test --test crash`: SIGKILL at named points, then `--resume`
- `cargo test --test store_concurrency`: many processes on one store
- `cargo test --test hostile` and `--test secrets`, when those test files exist
- `fuzz/run.sh S`: every target in fuzz/fuzz_targets under libFuzzer on stable Rust,
  `--fuzz-seconds` (default 20) per target

Figure lines (one JSON object per line, key `suite` or `kind`):

- `faults`:  `rate`, `tasks`, `injected` {class: n}, `retries_by_class`, `results_lost`,
             `completed_twice`
- `fail_fast`: `case`, `requests`
- `crash`:   `kill_point`, `kills`, `results_lost`
- `store`:   `processes`, `locked_errors`, `lost_updates`, `duplicate_ids`
- `hostile`: `case`, `passed` (bool)   — optional; else the test binary's pass count is used
- `secrets`: `leaks`, `files_checked`, `streams_checked` — optional; else the pass count
- `fuzz`:    `target`, `seconds`, `execs`, `crashes` (written by fuzz/run.sh)

Exits 1 when a test fails, a fuzz target crashes, a result is lost or a secret leaks.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cargo_test(name, figures, log):
    """Runs one integration test binary; returns (passed, failed) or None when absent."""
    if not (ROOT / "tests" / f"{name}.rs").exists():
        return None
    env = dict(os.environ, SUMMON_FIGURES=str(figures))
    started = time.monotonic()
    proc = subprocess.run(
        ["cargo", "test", "--test", name],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log.write(proc.stdout)
    passed = sum(int(n) for n in re.findall(r"test result: \w+\. (\d+) passed", proc.stdout))
    failed = sum(int(n) for n in re.findall(r"; (\d+) failed", proc.stdout))
    if proc.returncode != 0 and failed == 0:
        failed = 1  # did not build or crashed
    print(
        f"  {name}: {passed} passed, {failed} failed ({time.monotonic() - started:.0f}s)",
        file=sys.stderr,
    )
    return passed, failed


def run_fuzz(seconds, figures, log):
    """Runs every fuzz target for `seconds` through fuzz/run.sh (libFuzzer on stable Rust);
    returns {target: (executions, crashes)}, or None when the targets are missing."""
    script = ROOT / "fuzz" / "run.sh"
    if not script.is_file():
        return None
    started = time.monotonic()
    before = len(figures.read_text().splitlines())
    proc = subprocess.run(
        ["bash", str(script), str(seconds)],
        cwd=ROOT,
        env=dict(os.environ, SUMMON_FIGURES=str(figures)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log.write(proc.stdout)
    results = {}
    for line in figures.read_text().splitlines()[before:]:
        entry = json.loads(line)
        if entry.get("kind") == "fuzz":
            results[entry["target"]] = (entry["execs"], entry["crashes"])
    if not results and proc.returncode != 0:
        results["build"] = (0, 1)
    for target, (execs, crashes) in sorted(results.items()):
        print(f"  fuzz {target}: {execs} executions, {crashes} crashes", file=sys.stderr)
    print(f"  fuzz: {time.monotonic() - started:.0f}s", file=sys.stderr)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz-seconds", type=int, default=20)
    parser.add_argument("--no-fuzz", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="summon-reliability-"))
    figures = tmp / "figures.jsonl"
    figures.touch()
    log_path = tmp / "log.txt"
    tests = {}
    with open(log_path, "w") as log:
        print("summon reliability suite (log: %s)" % log_path, file=sys.stderr)
        for name in ["faults", "crash", "store_concurrency", "hostile", "secrets"]:
            tests[name] = cargo_test(name, figures, log)
        fuzz = None if args.no_fuzz else run_fuzz(args.fuzz_seconds, figures, log)

    lines = [json.loads(l) for l in figures.read_text().splitlines() if l.strip()]
    by_suite = defaultdict(list)
    for line in lines:
        by_suite[line.get("suite") or line.get("kind")].append(line)

    rows = []  # (what, figure, ok)

    # Faults.
    injected = defaultdict(int)
    tasks = lost = twice = 0
    for f in by_suite["faults"]:
        tasks += f["tasks"]
        lost += f["results_lost"]
        twice += f["completed_twice"]
        for cls, n in f["injected"].items():
            injected[cls] += n
    faults_ok = tests["faults"] is not None and tests["faults"][1] == 0
    rates = ", ".join(f"{f['rate']:.0%}" for f in sorted(by_suite["faults"], key=lambda f: f["rate"]))
    total = sum(injected.values())
    rows.append((f"faults injected ({rates}; {tasks} tasks)", f"{total}", faults_ok))
    for cls in sorted(injected):
        rows.append((f"  {cls}", f"{injected[cls]} injected, {injected[cls] if faults_ok else '?'} survived", faults_ok))
    rows.append(("results lost / completed twice under faults", f"{lost} / {twice}", lost == 0 and twice == 0 and faults_ok))
    for f in by_suite["fail_fast"]:
        rows.append((f"fail fast: {f['case']}", f"{f['requests']} requests, no retry", faults_ok))

    # Crashes.
    crash = by_suite["crash"]
    kills = sum(c["kills"] for c in crash)
    crash_lost = sum(c["results_lost"] for c in crash)
    crash_ok = tests["crash"] is not None and tests["crash"][1] == 0
    rows.append(("kill points (SIGKILL, then --resume)", f"{len(crash)} points, {kills} kills", crash_ok))
    rows.append(("results lost after kill -9", f"{crash_lost}", crash_lost == 0 and crash_ok))

    # Store.
    store = by_suite["store"]
    store_ok = tests["store_concurrency"] is not None and tests["store_concurrency"][1] == 0
    if store:
        s = store[0]
        rows.append((f"concurrent processes on one store", f"{s['processes']}: {s['locked_errors']} locked, {s['lost_updates']} lost, {s['duplicate_ids']} duplicate ids", store_ok))

    # Fuzzing.
    if fuzz is None:
        rows.append(("fuzz executions / crashes", "not run (--no-fuzz)", True))
    else:
        runs = sum(r for r, _ in fuzz.values())
        crashes = sum(c for _, c in fuzz.values())
        rows.append((f"fuzz executions / crashes ({len(fuzz)} targets)", f"{runs} / {crashes}", crashes == 0))

    # Hostile input.
    hostile = by_suite["hostile"]
    if hostile:
        passed = sum(1 for h in hostile if h.get("passed"))
        rows.append(("hostile cases tried / passed", f"{len(hostile)} / {passed}", passed == len(hostile)))
    elif tests["hostile"] is not None:
        p, f = tests["hostile"]
        rows.append(("hostile tests run / passed", f"{p + f} / {p}", f == 0))
    else:
        rows.append(("hostile cases", "not run (tests/hostile.rs missing)", True))

    # Secrets.
    secrets = by_suite["secrets"]
    if secrets:
        leaks = sum(s.get("leaks", 0) for s in secrets)
        files = sum(s.get("files_checked", 0) for s in secrets)
        streams = sum(s.get("streams_checked", 0) for s in secrets)
        rows.append(("secret leaks", f"{leaks} ({files} files, {streams} output streams checked)", leaks == 0))
    elif tests["secrets"] is not None:
        p, f = tests["secrets"]
        rows.append(("secret leaks (tests failed)", f"{f} ({p} tests passed)", f == 0))
    else:
        rows.append(("secret leaks", "not run (tests/secrets.rs missing)", True))

    all_ok = all(ok for _, _, ok in rows) and all(
        t is None or t[1] == 0 for t in tests.values()
    )
    if args.json:
        print(json.dumps({"rows": [{"what": w, "figure": f, "ok": ok} for w, f, ok in rows],
                          "ok": all_ok}, indent=2))
    else:
        width = max(len(w) for w, _, _ in rows)
        fwidth = max(len(f) for _, f, _ in rows)
        print(f"| {'what'.ljust(width)} | {'figure'.ljust(fwidth)} | ok  |")
        print(f"|{'-' * (width + 2)}|{'-' * (fwidth + 2)}|-----|")
        for what, figure, ok in rows:
            print(f"| {what.ljust(width)} | {figure.ljust(fwidth)} | {'yes' if ok else 'NO '} |")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
