#!/usr/bin/env python3
"""Structured-answer benchmark: N classification tasks in one fan-out (one request each, an
object schema with `category` and `priority`) against the local mock, which answers a share R
of first answers the way chat models often do: a sentence, then the JSON in a ```json block
(`summon-mock-llm --fence-rate R --fence-seed S`; which tasks is drawn from a hash of the seed
and the task's message, so every case fences the same tasks). Counts and tokens are read from
the run's report.json (`total.corrections`, `input_tokens`, `output_tokens`; the mock bills
input by request size, so the `response_format` schema counts), the mock's fenced answers and
correction turns from its exit line.

Cases:
  default      the provider's default mechanism (`response_format` json_schema, strict) with
               lenient extraction. The mock ignores `response_format` (as a server that accepts
               it without enforcing it), so this case sees the same fenced answers as the next.
  none         `structured_output: none`: the prompt and lenient extraction only.
  old path     what validation without lenient extraction cost: the whole answer had to parse,
               so every fenced answer was re-asked once. Simulated without building old code:
               the mock writes the fenced JSON with single quotes (`--fence-broken`), which no
               JSON parser reads, so the same tasks get an answer of the same length that
               cannot be used, one correction request each, and a bare answer to it; requests
               carry no `response_format` (`structured_output: none`), as before. Its
               correction count must equal the fenced answers of the other cases.

    benches/structured.py [N] [RATE] [SEED]     # default 1000 0.3 1

Counts do not depend on the build, so the debug build is used. Everything runs on 127.0.0.1;
each run is bounded (600 s), and only the mock processes this script started are stopped.
"""
import json, os, re, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANSWER = '{"category":"bug","priority":2}'
PIPELINE = """version: 1
name: classify
steps:
  - id: tickets
    decompose:
      file: tickets.csv
  - id: labels
    fan_out:
      over: tickets
      instructions: "Classify ticket {{ item.id }}: {{ item.text }}"
      extensions: []
      schema:
        type: object
        additionalProperties: false
        required: [category, priority]
        properties:
          category: {type: string, enum: [bug, feature, question]}
          priority: {type: integer, minimum: 1, maximum: 3}
    on_error: continue
"""


def build():
    subprocess.run(["cargo", "build", "--quiet", "-p", "summon-mock-llm", "-p", "summon"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return tuple(os.path.join(target, "debug", name) for name in ("summon", "summon-mock-llm"))


def run_case(summon, mock, work, n, rate, seed, setting, broken):
    """Runs the fan-out once; returns the report's totals and the mock's counts."""
    case = os.path.join(work, f"{setting}-{int(broken)}")
    os.makedirs(case)
    with open(os.path.join(case, "tickets.csv"), "w") as f:
        f.write("id,text\n")
        for i in range(n):
            f.write(f"{i},the export button does nothing on page {i}\n")
    with open(os.path.join(case, "p.yaml"), "w") as f:
        f.write(PIPELINE)
    with open(os.path.join(case, "summon.yaml"), "w") as f:
        f.write(f"providers:\n  openai:\n    structured_output: {setting}\n")
    args = [mock, "--port", "0", "--no-stdin", "--max-seconds", "900", "--reply", ANSWER,
            "--fence-rate", str(rate), "--fence-seed", str(seed)] + (["--fence-broken"] if broken else [])
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip().rsplit(":", 1)[1]
        env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="sk-bench",
                   SUMMON_MODEL="bench", CI="1")
        proc = subprocess.run([summon, "run", "p.yaml", "--out", "out", "--quiet", "--concurrency", "16"],
                              cwd=case, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=600)
        if proc.returncode != 0:
            sys.exit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    finally:
        server.terminate()
        _, mock_err = server.communicate(timeout=60)
    counts = re.search(r"first answers (\d+), fenced (\d+), correction turns (\d+)", mock_err)
    if not counts:
        sys.exit(f"no counts from the mock: {mock_err[-2000:]}")
    with open(os.path.join(case, "out", "report.json")) as f:
        total = json.load(f)["total"]
    data = set()
    with open(os.path.join(case, "out", "results.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if row.get("step") == "labels":
                data.add(json.dumps(row.get("data"), sort_keys=True))
    if total["completed"] != n or data != {json.dumps(json.loads(ANSWER), sort_keys=True)}:
        sys.exit(f"{setting}: {total['completed']} of {n} completed, data {sorted(data)[:3]}")
    first, fenced, turns = (int(g) for g in counts.groups())
    return total, first, fenced, turns


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    summon, mock = build()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for label, setting, broken in [("default (json_schema strict + lenient extraction)", "json_schema", False),
                                       ("`structured_output: none` (prompt + lenient extraction)", "none", False),
                                       ("old path: no lenient extraction (simulated, see above)", "none", True)]:
            total, first, fenced, turns = run_case(summon, mock, work, n, rate, seed, setting, broken)
            rows.append((label, total, first, fenced, turns))
    base = rows[2][1]["input_tokens"] + rows[2][1]["output_tokens"]
    print(f"{n} tasks, {rate:.0%} of first answers fenced (seed {seed}):\n")
    print("| case | requests | fenced answers | correction requests | input tokens | output tokens "
          "| tokens billed | billed / old path |")
    print("|---|---|---|---|---|---|---|---|")
    for label, total, first, fenced, turns in rows:
        billed = total["input_tokens"] + total["output_tokens"]
        print(f"| {label} | {first + turns} | {fenced} | {total['corrections']} | {total['input_tokens']} "
              f"| {total['output_tokens']} | {billed} | {billed / base:.3f} |")
    old = rows[2]
    if old[1]["corrections"] != old[3] or old[3] != rows[0][3]:
        sys.exit(f"the old path's corrections ({old[1]['corrections']}) differ from the fenced answers "
                 f"({old[3]}, {rows[0][3]})")


if __name__ == "__main__":
    main()
