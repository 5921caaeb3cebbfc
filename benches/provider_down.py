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
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
summon = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(root, "target/debug/summon")
mock = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(root, "target/debug/summon-mock-llm")
n, c = 1000, 256
with tempfile.TemporaryDirectory() as work:
    with open(os.path.join(work, "rows.csv"), "w") as f:
        f.write("id,text\n" + "".join(f"{i},row {i}\n" for i in range(n)))
    with open(os.path.join(work, "fan.yaml"), "w") as f:
        f.write("""version: 1
name: dead
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
""")
    server = subprocess.Popen([mock, "--lean", "--port", "0", "--latency-ms", "200", "--no-stdin", "--max-seconds", "300"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = server.stdout.readline().strip().rsplit(":", 1)[1]
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
