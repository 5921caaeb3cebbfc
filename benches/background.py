#!/usr/bin/env python3
"""Background-task overhead: what `summon delegate --async` followed by `summon load ID` costs
beyond the same task run in the foreground (`summon delegate`), against the local mock server
answering after L ms (10 by default). Each round runs the foreground task, then the async start
and the load right after it, alternating, in one project directory; the table gives medians and
quartiles over R rounds (20 by default) after two warm-up rounds.

    benches/background.py            # 20 rounds at L = 10 ms
    benches/background.py R L_MS     # your own
"""
import os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 2


def build():
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "summon-mock-llm", "-p", "summon"],
                   cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    release = os.path.join(target, "release")
    return tuple(os.path.join(release, name) for name in ("summon", "summon-mock-llm"))


def start_mock(mock, latency_ms):
    """Starts the mock server; returns the process and its port."""
    server = subprocess.Popen([mock, "--lean", "--port", "0", "--latency-ms", str(latency_ms), "--no-stdin",
                               "--max-seconds", "600"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return server, server.stdout.readline().strip().rsplit(":", 1)[1]


def timed(args, cwd, env):
    """Runs summon; returns (seconds, stdout). A failure stops the bench."""
    start = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[1:])} exited {done.returncode}:\n{done.stderr}")
    return elapsed, done.stdout


def quartiles(values):
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values) * 1000:.1f} ({q[0] * 1000:.1f}-{q[2] * 1000:.1f})"


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    latency_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    summon, mock = build()
    server, port = start_mock(mock, latency_ms)
    try:
        with tempfile.TemporaryDirectory() as work:
            env = {"PATH": os.environ.get("PATH", ""), "HOME": work, "CI": "1",
                   "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "sk-bench",
                   "SUMMON_MODEL": "bench"}
            foreground, start, load, overhead = [], [], [], []
            for i in range(WARMUP + rounds):
                fg, answer = timed([summon, "delegate", "--instructions", f"task {i}"], work, env)
                assert answer.strip() == f"echo: task {i}", answer
                st, started = timed([summon, "delegate", "--async", "--json", "--instructions", f"task {i}"],
                                    work, env)
                task_id = started.split('"task_id":')[1].split('"')[1]
                ld, answer = timed([summon, "load", task_id, "--timeout", "30"], work, env)
                assert answer.strip() == f"echo: task {i}", answer
                if i >= WARMUP:
                    foreground.append(fg)
                    start.append(st)
                    load.append(ld)
                    overhead.append(st + ld - fg)
    finally:
        server.kill()
        server.wait()
    print(f"{rounds} rounds, mock latency {latency_ms} ms; milliseconds, median (quartiles)\n")
    print("| foreground delegate | delegate --async | load ID | overhead (async + load - foreground) |")
    print("|---|---|---|---|")
    print(f"| {quartiles(foreground)} | {quartiles(start)} | {quartiles(load)} | {quartiles(overhead)} |")
    target = 0.050
    verdict = "under" if statistics.median(overhead) < target else "OVER"
    print(f"\nmedian overhead {statistics.median(overhead) * 1000:.1f} ms: {verdict} the {target * 1000:.0f} ms target")


if __name__ == "__main__":
    main()
