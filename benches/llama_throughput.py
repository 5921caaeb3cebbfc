#!/usr/bin/env python3
"""Throughput against a real inference server: tasks per minute of a CSV fan-out through
llama.cpp's `llama-server` with Gemma 3 270M, at concurrency 1, 2 and 4, and summon's CPU
share of each run.

The server is the one `.ci/llama.sh` builds and caches (its `SUMMON_LLAMA_SERVER` and
`SUMMON_LLAMA_MODEL`, read from the script's output when they are not set). It is started
on 127.0.0.1 with 4 slots (`--parallel 4`, `--ctx-size 8192`, so every slot has 2,048 tokens)
and 2 threads, once for all runs, and stopped by its PID at the end.

Each run is `summon run` of N single-turn tasks (a recipe with a parameter whose answer is a
small JSON object, so the server's grammar keeps every answer short), `temperature: 0`,
`max_output_tokens: 40`, `--out`; the figures are from the run's `report.json` and the wall
clock. summon's CPU share is its user + system time (of the process and its children) over
the run's wall time; the server's, the same from /proc.

    benches/llama_throughput.py            # N = 24 tasks per run, debug build
    benches/llama_throughput.py N
    benches/llama_throughput.py --release  # the release binary
"""
import json, os, resource, socket, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT = 600
RECIPE = """version: 1.0.0
title: Word
description: One word about a topic
instructions: Answer with JSON only.
prompt: 'Topic: {{ topic }}. One word about it.'
parameters:
  - key: topic
    input_type: string
    requirement: required
    description: the topic
settings:
  max_turns: 1
response:
  json_schema:
    type: object
    properties:
      word: {type: string, maxLength: 12}
    required: [word]
    additionalProperties: false
"""
PIPELINE = """version: 1
name: words
settings:
  max_output_tokens: 40
  temperature: 0
steps:
  - id: rows
    decompose:
      file: rows.csv
  - id: each
    fan_out:
      over: rows
      source: word
      parameters:
        topic: '{{ item.topic }}'
"""
TOPICS = ["rain", "salt", "iron", "moss", "wind", "clay", "snow", "sand", "fire", "milk",
          "wool", "silk", "gold", "lead", "rice", "corn", "bark", "leaf", "reef", "dune"]


def llama_paths():
    server, model = os.environ.get("SUMMON_LLAMA_SERVER"), os.environ.get("SUMMON_LLAMA_MODEL")
    if server and model:
        return server, model
    out = subprocess.run(["bash", os.path.join(ROOT, ".ci/llama.sh")], check=True,
                         capture_output=True, text=True).stdout
    values = dict(line.split(" ", 1)[1].split("=", 1) for line in out.splitlines()
                  if line.startswith("export "))
    return values["SUMMON_LLAMA_SERVER"], values["SUMMON_LLAMA_MODEL"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """user + system CPU of a running process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(server, model, log):
    port = free_port()
    proc = subprocess.Popen(
        [server, "--model", model, "--host", "127.0.0.1", "--port", str(port),
         "--ctx-size", "8192", "--parallel", "4", "--threads", "2", "--jinja", "--no-webui"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("llama-server exited; see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("llama-server not ready after 2 minutes")


def run(binary, port, tasks, concurrency, server_pid):
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "recipes"))
        with open(os.path.join(tmp, "recipes/word.yaml"), "w") as f:
            f.write(RECIPE)
        with open(os.path.join(tmp, "p.yaml"), "w") as f:
            f.write(PIPELINE)
        with open(os.path.join(tmp, "rows.csv"), "w") as f:
            f.write("id,topic\n")
            for i in range(tasks):
                f.write(f"{i},{TOPICS[i % len(TOPICS)]} {i}\n")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": tmp,
               "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "sk-local",
               "SUMMON_MODEL": "gemma"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_before = cpu_seconds(server_pid)
        start = time.monotonic()
        done = subprocess.run(
            [binary, "run", "p.yaml", "--concurrency", str(concurrency), "--out", "out",
             "--quiet"], cwd=tmp, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu = cpu_seconds(server_pid) - server_before
        if done.returncode != 0:
            raise SystemExit(f"summon run failed ({done.returncode}):\n{done.stderr}")
        with open(os.path.join(tmp, "out/report.json")) as f:
            report = json.load(f)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return {
            "concurrency": concurrency, "tasks": tasks, "wall_s": round(wall, 2),
            "tasks_per_min": round(tasks * 60 / wall, 1),
            "summon_cpu_s": round(cpu, 2), "summon_cpu_share": round(cpu / wall, 3),
            "server_cpu_share": round(server_cpu / wall, 2),
            "input_tokens": report["total"]["input_tokens"],
            "output_tokens": report["total"]["output_tokens"],
            "cache_read_tokens": report["total"].get("cache_read_tokens", 0),
        }


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    release = "--release" in sys.argv
    tasks = int(args[0]) if args else 24
    profile = "release" if release else "debug"
    subprocess.run(["cargo", "build", "--quiet"] + (["--release"] if release else []),
                   cwd=ROOT, check=True)
    binary = os.path.join(ROOT, "target", profile, "summon")
    server, model = llama_paths()
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        proc, port = start_server(server, model, log)
        try:
            rows = [run(binary, port, tasks, c, proc.pid) for c in (1, 2, 4)]
        finally:
            proc.kill()
            proc.wait()
    print(f"{tasks} tasks per run, {profile} build, llama-server --parallel 4 --threads 2, "
          f"{os.cpu_count()} cores")
    print("| concurrency | wall | tasks/min | summon CPU (share of wall) | server CPU share "
          "| input / output / cached tokens |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['wall_s']} s | {r['tasks_per_min']} | "
              f"{r['summon_cpu_s']} s ({r['summon_cpu_share'] * 100:.1f} %) | "
              f"{r['server_cpu_share'] * 100:.0f} % | {r['input_tokens']} / "
              f"{r['output_tokens']} / {r['cache_read_tokens']} |")
    if os.environ.get("SUMMON_FIGURES"):
        with open(os.environ["SUMMON_FIGURES"], "a") as f:
            for r in rows:
                f.write(json.dumps({"bench": "llama_throughput", **r}) + "\n")


if __name__ == "__main__":
    main()
