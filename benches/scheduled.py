#!/usr/bin/env python3
"""Scheduled-runs benchmark: the store's size under repeated runs, and what `--reuse` saves.

1. The same pipeline (a CSV of N rows, one single-turn task per row, answers of about 100
   words that differ from run to run, as a real model's do: the mock echoes the request,
   which carries the run's number) is run R times in one project; the size of `.summon/` (database and WAL) is printed
   after 1, 10 and R runs, with the default retention (the newest 20 runs and everything from
   the last 7 days: on a benchmark's clock every run is recent, so nothing is pruned) and with
   `store: {keep_runs: 5, keep_days: 0}` (target: flat after the fifth run).
2. An hourly-style sequence: the CSV grows by 1% before each run, run with `--reuse`; prints
   the requests each run sent (target: only the new rows) and its wall time, against the
   same sequence without `--reuse`.

    benches/scheduled.py              # N=2000, R=50, 10 growth steps
    benches/scheduled.py N R STEPS
"""
import json, os, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILLER = " ".join(f"word{i}" for i in range(95))


def build():
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "summon-mock-llm", "-p", "summon"],
                   cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    release = os.path.join(target, "release")
    return os.path.join(release, "summon"), os.path.join(release, "summon-mock-llm")


def start_mock(mock):
    server = subprocess.Popen([mock, "--lean", "--port", "0", "--no-stdin",
                               "--max-seconds", "1800"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    return server, server.stdout.readline().strip().rsplit(":", 1)[1]


def write_csv(path, rows):
    with open(path, "w") as f:
        f.write("id,text\n")
        for i in range(rows):
            f.write(f"{i},classify ticket number {i} {FILLER}\n")


def project(work, rows, config):
    write_csv(os.path.join(work, "rows.csv"), rows)
    with open(os.path.join(work, "p.yaml"), "w") as f:
        f.write("""version: 1
name: scheduled
parameters:
  - {key: run, input_type: string, requirement: optional, default: "0"}
steps:
  - id: rows
    decompose:
      file: rows.csv
  - id: label
    fan_out:
      over: rows
      instructions: "run {{ run }}: {{ item.text }}"
      extensions: []
""")
    if config:
        with open(os.path.join(work, "summon.yaml"), "w") as f:
            f.write(config)


def run(summon, work, port, extra=()):
    env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="sk-bench",
               SUMMON_MODEL="bench", CI="1")
    start = time.perf_counter()
    subprocess.run([summon, "run", "p.yaml", "--concurrency", "64", "--out", "out", "--quiet", *extra],
                   cwd=work, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    with open(os.path.join(work, "out", "report.json")) as f:
        report = json.load(f)
    label = report["steps"]["label"]
    return wall, label["completed"] + label["failed"] - label["reused"]


def store_size(work):
    total = 0
    for name in ("state.db", "state.db-wal"):
        path = os.path.join(work, ".summon", name)
        if os.path.exists(path):
            total += os.path.getsize(path)
    return total


def sizes(summon, port, n, runs, config):
    marks = sorted({1, min(10, runs), runs})
    out = {}
    with tempfile.TemporaryDirectory() as work:
        project(work, n, config)
        for i in range(1, runs + 1):
            run(summon, work, port, ["--param", f"run={i}"])
            if i in marks:
                out[i] = store_size(work)
    return marks, out


def growth(summon, port, n, steps, reuse):
    rows = []
    with tempfile.TemporaryDirectory() as work:
        size = n
        project(work, size, None)
        for step in range(steps):
            if step:
                size += max(1, n // 100)
                write_csv(os.path.join(work, "rows.csv"), size)
            wall, sent = run(summon, work, port, ["--reuse"] if reuse else [])
            rows.append((step + 1, size, sent, wall))
    return rows


def main():
    args = [int(a) for a in sys.argv[1:]]
    n, runs, steps = (args + [2000, 50, 10][len(args):])[:3]
    summon, mock = build()
    server, port = start_mock(mock)
    try:
        print(f"## store size, {n} tasks per run\n")
        configs = [("default (20 runs + 7 days)", None),
                   ("keep_runs: 5, keep_days: 0", "store: {keep_runs: 5, keep_days: 0}\n")]
        results = [(name, *sizes(summon, port, n, runs, config)) for name, config in configs]
        marks = results[0][1]
        print("| retention | " + " | ".join(f"after {m} run{'s' if m > 1 else ''}" for m in marks) + " |")
        print("|---|" + "---|" * len(marks))
        for name, marks, by_run in results:
            print(f"| {name} | " + " | ".join(f"{by_run[m] / 1e6:.1f} MB" for m in marks) + " |")
        print(f"\n## hourly growth (+1% rows per run), {steps} runs\n")
        plain = growth(summon, port, n, steps, False)
        reused = growth(summon, port, n, steps, True)
        print("| run | rows | requests, no --reuse | requests, --reuse | wall s, no --reuse | wall s, --reuse |")
        print("|---|---|---|---|---|---|")
        for (i, size, sent_a, wall_a), (_, _, sent_b, wall_b) in zip(plain, reused):
            print(f"| {i} | {size} | {sent_a} | {sent_b} | {wall_a:.2f} | {wall_b:.2f} |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
