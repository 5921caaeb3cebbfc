#!/usr/bin/env python3
"""A provider that dies mid-run: what it costs and how the run ends.

    benches/provider_down.py [SUMMON [SUMMON_MOCK_LLM]]

A fan-out of 1,000 single-turn tasks at concurrency 256 against the lean mock answering after
200 ms; the mock is killed 1 s in. Prints the exit code (75 expected), the time from the kill
to the exit (about SUMMON_UNREACHABLE_MS, 30 s by default), the tasks kept, the connection
retries in all (report.json's retries_by_class) and the run's last lines. The binaries default
to target/debug/summon and target/debug/summon-mock-llm (`cargo build -p summon -p
summon-mock-llm`).
"""
import json, os, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fanout import start_mock, write_fan_out
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
summon = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(root, "target/debug/summon")
mock = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(root, "target/debug/summon-mock-llm")
n, c = 1000, 256
with tempfile.TemporaryDirectory() as work:
    write_fan_out(work, n)
    server, port = start_mock(mock, 200)
    env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="sk-bench", SUMMON_MODEL="bench", CI="1")
    start = time.perf_counter()
    proc = subprocess.Popen([summon, "run", "fan.yaml", "--concurrency", str(c), "--out", "out", "--quiet"], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    server.kill(); server.wait()
    killed = time.perf_counter()
    _, err = proc.communicate(timeout=600)
    end = time.perf_counter()
    report = json.load(open(os.path.join(work, "out", "report.json")))
    lines = [json.loads(l) for l in open(os.path.join(work, "out", "results.jsonl"))]
    done = sum(1 for l in lines if l.get("status") == "completed")
    print(f"exit {proc.returncode}; {end-killed:.1f} s from the kill to the exit; {done} completed, {len(lines)} recorded of {n}")
    print("retries_by_class:", json.dumps(report.get("retries_by_class") or report.get("totals", {}).get("retries_by_class")))
    print(err.strip().splitlines()[-3:])
