#!/usr/bin/env python3
"""Tables-out benchmark: a classification fan-out over N literal rows (a CSV file of items,
an inline `schema:`, the lean mock answering `{"category": "billing"}` at once) run with and
without a table output (`out/labels.csv`, four columns, one row per item). Prints summon's
peak RSS (`ru_maxrss` of the summon process, from wait4) and wall time for each case, the
table's cost (RSS with the table / without) and the growth from the smallest N to the largest
(RSS at N_max / RSS at N_min, with and without the table): the table must not add growth with
rows beyond the fan-out's own.

    benches/tables.py                 # N = 10,000 and 100,000, debug binaries
    benches/tables.py --release       # build and use release binaries
    benches/tables.py 2000 20000      # your own N
    benches/tables.py --reduce        # also: 3,000 notes reduced into a 32,000-token window

`--reduce` adds one row: 3,000 notes fanned out (the mock answering 400 characters, about 100
tokens, each), then a synthesis with `reduce: auto` and `context_window: 32000`; it prints the
levels and tasks per level from report.json, the wall time and summon's peak RSS.

Each summon run is bounded (900 s) and killed past it; the mock stops by itself too. The mock
listens on 127.0.0.1 only.
"""
import os, signal, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_S = 900
CONCURRENCY = 128


def binaries(release):
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    profile = "release" if release else "debug"
    cmd = ["cargo", "build", "--quiet", "-p", "summon-mock-llm", "-p", "summon"]
    if release:
        cmd.insert(2, "--release")
    subprocess.run(cmd, cwd=ROOT, check=True)
    return tuple(os.path.join(target, profile, name) for name in ("summon", "summon-mock-llm"))


def start_mock(mock):
    server = subprocess.Popen([mock, "--lean", "--port", "0", "--no-stdin", "--max-seconds", str(LIMIT_S * 2),
                               "--reply", '{"category":"billing"}'],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return server, server.stdout.readline().strip().rsplit(":", 1)[1]


PIPELINE = """version: 1
name: bench
steps:
  - id: rows
    decompose:
      file: rows.csv
  - id: labels
    fan_out:
      over: rows
      instructions: "Classify: {{ item.text }}"
      extensions: []
      schema:
        type: object
        additionalProperties: false
        required: [category]
        properties:
          category: { type: string }
    on_error: continue
"""

TABLE = """outputs:
  - path: out/labels.csv
    rows: labels
    columns:
      id: "{{ item.id }}"
      text: "{{ item.text }}"
      category: "{{ data.category }}"
      status: "{{ status }}"
"""


def wait_bounded(proc, start, what):
    """Waits for summon (killed past LIMIT_S); its exit status and its own resource use."""
    deadline = start + LIMIT_S
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, usage
        if time.perf_counter() > deadline:
            proc.send_signal(signal.SIGKILL)
            os.wait4(proc.pid, 0)
            raise SystemExit(f"{what}: summon ran past {LIMIT_S} s; killed")
        time.sleep(0.05)


def run_case(summon, mock, n, table):
    """(peak RSS in MiB, wall seconds, rows in the table or None)."""
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "rows.csv"), "w") as f:
            f.write("id,text\n")
            for i in range(n):
                f.write(f'{i},"ticket {i}: the invoice, ""due"" today"\n')
        with open(os.path.join(work, "p.yaml"), "w") as f:
            f.write(PIPELINE + (TABLE if table else ""))
        server, port = start_mock(mock)
        try:
            env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="sk-bench-0123456789",
                       SUMMON_MODEL="bench", CI="1", HOME=work)
            start = time.perf_counter()
            proc = subprocess.Popen([summon, "run", "p.yaml", "--concurrency", str(CONCURRENCY), "--quiet"],
                                    cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            status, usage = wait_bounded(proc, start, f"N={n}")
            wall = time.perf_counter() - start
            err = proc.stderr.read().decode(errors="replace")
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"N={n} table={table}: summon failed:\n{err[-2000:]}")
            rows = None
            if table:
                import csv
                with open(os.path.join(work, "out", "labels.csv"), newline="") as f:
                    records = list(csv.reader(f))
                rows = len(records) - 1
                assert rows == n, (rows, n)
                assert records[1] == ["0", 'ticket 0: the invoice, "due" today', "billing", "completed"], records[1]
            return usage.ru_maxrss / 1024, wall, rows
        finally:
            server.kill()
            server.wait()


REDUCE = """version: 1
name: reduce
steps:
  - id: notes
    decompose:
      file: notes.csv
  - id: each
    fan_out:
      over: notes
      instructions: "Note: {{ item.text }}"
      extensions: []
  - id: summary
    synthesize:
      instructions: |
        Summarize:
        {% for r in steps.each.results %}{{ r.output }}
        {% endfor %}
      extensions: []
    reduce: auto
    context_window: 32000
    max_output_tokens: 1000
"""


def run_reduce(summon, mock, n=3000):
    """(levels [(level, tasks)], wall seconds, peak RSS in MiB)."""
    import json
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "notes.csv"), "w") as f:
            f.write("id,text\n")
            for i in range(n):
                f.write(f"{i},note {i}\n")
        with open(os.path.join(work, "p.yaml"), "w") as f:
            f.write(REDUCE)
        server = subprocess.Popen([mock, "--lean", "--port", "0", "--no-stdin", "--max-seconds", str(LIMIT_S * 2),
                                   "--reply", "x" * 400], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        port = server.stdout.readline().strip().rsplit(":", 1)[1]
        try:
            env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="sk-bench-0123456789",
                       SUMMON_MODEL="bench", CI="1", HOME=work)
            start = time.perf_counter()
            proc = subprocess.Popen([summon, "run", "p.yaml", "--concurrency", "64", "--quiet", "--out", "out"],
                                    cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            status, usage = wait_bounded(proc, start, "the reduce case")
            wall = time.perf_counter() - start
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit("the reduce case failed:\n" + proc.stderr.read().decode(errors="replace")[-2000:])
            with open(os.path.join(work, "out", "report.json")) as f:
                report = json.load(f)
            steps = report["steps"]
            step = steps["summary"] if isinstance(steps, dict) else next(s for s in steps if s.get("id") == "summary")
            levels = [(l["level"], l["tasks"]) for l in step.get("levels", [])]
            return levels, wall, usage.ru_maxrss / 1024
        finally:
            server.kill()
            server.wait()


def main():
    args = sys.argv[1:]
    release = "--release" in args
    reduce = "--reduce" in args
    sizes = [int(a) for a in args if not a.startswith("--")] or [10_000, 100_000]
    summon, mock = binaries(release)
    if reduce:
        levels, wall, rss = run_reduce(summon, mock)
        shown = ", ".join(f"level {l}: {t}" for l, t in levels)
        print(f"| notes | levels (tasks) | wall | peak RSS |  ({'release' if release else 'debug'} build)")
        print("|---:|---|---:|---:|")
        print(f"| 3,000 | {len(levels)} ({shown}) | {wall:.1f} s | {rss:.1f} MiB |\n")
    results = {}
    for n in sizes:
        for table in (False, True):
            results[(n, table)] = run_case(summon, mock, n, table)
            rss, wall, _ = results[(n, table)]
            print(f"  measured N={n:,} table={'yes' if table else 'no'}: {rss:.1f} MiB, {wall:.1f} s",
                  file=sys.stderr, flush=True)
    build = "release" if release else "debug"
    print(f"| rows | peak RSS, no table | peak RSS, CSV table | CSV / no table | wall, no table | wall, CSV |  ({build} build, C={CONCURRENCY})")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        (a, wa, _), (b, wb, _) = results[(n, False)], results[(n, True)]
        print(f"| {n:,} | {a:.1f} MiB | {b:.1f} MiB | {b / a:.2f} | {wa:.1f} s | {wb:.1f} s |")
    if len(sizes) > 1:
        lo, hi = min(sizes), max(sizes)
        grow_plain = results[(hi, False)][0] / results[(lo, False)][0]
        grow_table = results[(hi, True)][0] / results[(lo, True)][0]
        print(f"\nRSS growth from {lo:,} to {hi:,} rows ({hi // lo}x): without the table {grow_plain:.2f}x, "
              f"with it {grow_table:.2f}x")


if __name__ == "__main__":
    main()
