#!/usr/bin/env python3
"""Fan-out benchmark: a pipeline that decomposes a CSV of N rows and fans out N single-turn
tasks at concurrency C against the local mock server answering after L ms, with the journal
and --out on. Prints wall time against the ideal (ceil(N/C) x L), CPU per task and peak RSS.

The ideal ignores that the mock server runs on the same machine, where a real provider's CPU
would not count: when C/L is high (25,600 requests a second at C=256, L=10 ms) the server takes
much of the CPU and the ideal is out of reach for any client. The bench therefore runs the
mock's lean server (`--lean`: one thread, hand-written HTTP/1.1, the same answers), which
spends about half the CPU per request of the full one. So each case also measures the physical floor: after the summon
run, `summon-load-floor` (testing/mock-llm/src/bin/floor.rs, a bare HTTP/1.1 keep-alive client
on one thread) sends the same N requests, with bodies of summon's size (the mean the mock
measured in the summon run), at the same C to a
freshly started mock with the same L. Its wall time is the floor, `wall / floor` is what summon
costs beyond it, and its CPU per request is about the least a client can spend on one. The
mock's own CPU per request (during the summon run) shows how much of the machine it takes.
The mock answers L ms after each request arrived by the system clock (to within 0.25 ms), not
by tokio's millisecond timer, which would add 1-2 ms to every answer.

    benches/fanout.py                      # the three standard cases
    benches/fanout.py N C L_MS [N C L_MS]  # your own cases
    benches/fanout.py --all ...            # every output on: --out (results.jsonl, report.json,
                                           # report.html), --junit and a CSV table output

SUMMON=path runs another summon binary; NO_BUILD=1 builds nothing (the release binaries are there).
"""
import math, os, re, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [(2000, 64, 200), (10000, 256, 100), (100000, 256, 10)]


def build():
    if not os.environ.get("NO_BUILD"):
        subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "summon-mock-llm", "-p", "summon"],
                       cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    release = os.path.join(target, "release")
    summon, mock, floor = (os.path.join(release, name) for name in ("summon", "summon-mock-llm", "summon-load-floor"))
    return os.environ.get("SUMMON", summon), mock, floor


def start_mock(mock, latency_ms):
    """Starts the mock server; returns the process and its port."""
    server = subprocess.Popen([mock, "--lean", "--port", "0", "--latency-ms", str(latency_ms), "--no-stdin",
                               "--max-seconds", "900"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return server, server.stdout.readline().strip().rsplit(":", 1)[1]


def stop_mock(server):
    """Stops the mock server; returns the mean body of the chat requests it answered (bytes),
    from the line it prints when it stops."""
    server.terminate()
    _, errors = server.communicate()
    found = re.search(r"chat bodies of (\d+) bytes on average", errors)
    if not found:
        sys.exit(f"the mock server did not say its requests' size: {errors[-2000:]}")
    return int(found.group(1))


def cpu_seconds(pid):
    """User plus system CPU time a running process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


ALL_OUTPUTS = """outputs:
  - path: out/rows.csv
    rows: tasks
    columns:
      id: "{{ item.id }}"
      text: "{{ item.text }}"
      status: "{{ status }}"
"""


def write_fan_out(work, n, outputs=""):
    """Writes rows.csv (N rows) and fan.yaml (a decompose of it and a fan-out of single-turn
    tasks without tools, going on after a failed one) into `work`, with `outputs` appended."""
    with open(os.path.join(work, "rows.csv"), "w") as f:
        f.write("id,text\n")
        for i in range(n):
            f.write(f"{i},classify row number {i}\n")
    with open(os.path.join(work, "fan.yaml"), "w") as f:
        f.write("""version: 1
name: bench
steps:
  - id: rows
    decompose:
      file: rows.csv
  - id: tasks
    fan_out:
      over: rows
      instructions: "{{ item.text }}"
      extensions: []
    on_error: continue
""" + outputs)


def run_case(summon, mock, n, c, latency_ms, all_outputs=False):
    with tempfile.TemporaryDirectory() as work:
        write_fan_out(work, n, ALL_OUTPUTS if all_outputs else "")
        server, port = start_mock(mock, latency_ms)
        try:
            env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="sk-bench",
                       SUMMON_MODEL="bench", CI="1")
            errors = open(os.path.join(work, "stderr.txt"), "w+")
            start = time.perf_counter()
            extra = ["--junit", "junit.xml"] if all_outputs else []
            proc = subprocess.Popen([summon, "run", "fan.yaml", "--concurrency", str(c), "--out", "out", "--quiet"]
                                    + extra, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=errors)
            # The run's own resource use, not the mock server's.
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                errors.seek(0)
                sys.exit(f"run failed ({proc.returncode}): {errors.read()[-2000:]}")
            mock_cpu = cpu_seconds(server.pid)
            lines = sum(1 for _ in open(os.path.join(work, "out", "results.jsonl")))
            if lines != n:
                sys.exit(f"results.jsonl has {lines} lines, expected {n}")
            if all_outputs:
                for name in ("out/report.json", "out/report.html", "out/rows.csv", "junit.xml"):
                    if not os.path.isfile(os.path.join(work, name)):
                        sys.exit(f"no {name}")
        finally:
            body_bytes = stop_mock(server)
    cpu = usage.ru_utime + usage.ru_stime
    ideal = math.ceil(n / c) * latency_ms / 1000
    return wall, ideal, cpu / n * 1000, usage.ru_maxrss / 1024, mock_cpu / n * 1000, body_bytes


def run_floor(floor, mock, n, c, latency_ms, body_bytes):
    """The same N requests at concurrency C, with bodies of `body_bytes`, sent by
    summon-load-floor: wall time and CPU per request (ms) of that client alone."""
    server, port = start_mock(mock, latency_ms)
    try:
        start = time.perf_counter()
        proc = subprocess.Popen([floor, "--addr", f"127.0.0.1:{port}", "--requests", str(n),
                                 "--concurrency", str(c), "--body-bytes", str(body_bytes)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        # One line each way: the pipes cannot fill up before the process ends.
        out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            sys.exit(f"floor client failed ({proc.returncode}): {out}{err[-2000:]}")
    finally:
        stop_mock(server)
    return wall, (usage.ru_utime + usage.ru_stime) / n * 1000


def main():
    all_outputs = "--all" in sys.argv[1:]
    args = [int(a) for a in sys.argv[1:] if a != "--all"]
    cases = [tuple(args[i:i + 3]) for i in range(0, len(args), 3)] if args else CASES
    summon, mock, floor = build()
    print("| N | C | L (ms) | wall (s) | ideal (s) | wall / ideal | CPU per task (ms) | peak RSS (MiB) "
          "| floor wall (s) | wall / floor | floor CPU per request (ms) | mock CPU per request (ms) | request body (B) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, c, latency in cases:
        wall, ideal, cpu_ms, rss, mock_ms, body_bytes = run_case(summon, mock, n, c, latency, all_outputs)
        floor_wall, floor_cpu_ms = run_floor(floor, mock, n, c, latency, body_bytes)
        print(f"| {n} | {c} | {latency} | {wall:.2f} | {ideal:.2f} | {wall / ideal:.3f} | {cpu_ms:.3f} | {rss:.1f} "
              f"| {floor_wall:.2f} | {wall / floor_wall:.3f} | {floor_cpu_ms:.4f} | {mock_ms:.4f} | {body_bytes} |", flush=True)


if __name__ == "__main__":
    main()
