#!/usr/bin/env python3
"""Prompt caching benchmark: what a fan-out and an agent loop are billed for their input with
summon's prompt caching on, against the same run with `cache: false`, per provider format, on
the test mock with the providers' caching rules (`summon-mock-llm --cache`).

Cases, each run once per format (Anthropic Messages, OpenAI Chat Completions):

- fan-out: 200 single-turn (`max_turns: 1`) ad-hoc tasks sharing a ~4,000-token `context`,
  concurrency 16, the mock answering L ms after each request arrived. Run with caching on
  (breakpoints / `prompt_cache_key`, and the warm-up: the first task alone, then the rest)
  and with `cache: false` on the step (no breakpoints, no warm-up), each on a fresh mock.
- loop: one task of 10 turns, the mock calling `list_files` 9 times (`--tool-turns 9`) and
  then answering, with the same context and the file tools (named in the step's `tools:`:
  a step written inline gets only the tools it names).

Billed input is in input-price units: Anthropic uncached + 1.25 x writes + 0.1 x reads;
OpenAI uncached + (cached_input / input, from the prices below) x reads. `billed / plain` is
that divided by the input tokens of the `cache: false` run at the full input price. OpenAI
caches long prefixes by itself, so its `cache: false` run is billed below plain too: the
`off` column shows that run's own billed share; the lines under the table give the OpenAI
ratios at other models' cached prices (gpt-4.1, configured here, bills reads at 0.25x).
Wall times are medians of R runs (debug build unless --release); `+L` is the difference (caching on minus off) in units of the mock latency L, and `+first` in units
of the warm-up task's own duration (L plus what summon and the mock spend on one request).
The per-task overhead lines give the fan-out step's `report.json` `overhead` (tokens beyond
the task's instructions and context, tool definitions included) beside the dry run's.

    benches/prompt_cache.py            # L = 200 ms, R = 3, debug build
    benches/prompt_cache.py L_MS R
    benches/prompt_cache.py --release  # release binaries

Every server listens on 127.0.0.1 and is stopped by its PID; each summon run is bounded by a
timeout.
"""
import json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITEMS, CONCURRENCY, LOOP_TOOL_TURNS = 200, 16, 9
RUN_TIMEOUT = 300
FORMATS = {
    # format: (model, price per million tokens)
    "anthropic": ("claude-sonnet-4-5", {"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75}),
    "openai": ("gpt-4.1", {"input": 2.0, "output": 8.0, "cached_input": 0.5}),
}


def build(release):
    cmd = ["cargo", "build", "--quiet", "-p", "summon-mock-llm", "-p", "summon"]
    if release:
        cmd.insert(2, "--release")
    subprocess.run(cmd, cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    profile = "release" if release else "debug"
    return tuple(os.path.join(target, profile, name) for name in ("summon", "summon-mock-llm"))


def context_text():
    """About 16,000 bytes (~4,000 tokens at four bytes a token) of varied, stable text."""
    words = ["label", "positive", "negative", "neutral", "customer", "invoice", "refund", "shipping",
             "delay", "praise", "complaint", "question", "product", "service", "quality", "price"]
    lines, i = [], 0
    while sum(len(l) + 1 for l in lines) < 16000:
        lines.append(f"Rule {i}: " + " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(9)) + ".")
        i += 1
    return "\n".join(lines)


def pipeline(cache, max_turns, items):
    ctx = "\n".join("        " + line for line in context_text().splitlines())
    listed = ", ".join(f'"r{i}"' for i in range(items))
    return f"""version: 1
name: cachebench
steps:
  - id: rows
    decompose:
      items: [{listed}]
  - id: each
    fan_out:
      over: rows
      instructions: "Classify item {{{{ item }}}} by the rules."
      context: |
{ctx}
    concurrency: {CONCURRENCY}
    max_turns: {max_turns}
{"    tools: [read_file, write_file, edit_file, list_files, search]" if max_turns > 1 else ""}
{"    cache: false" if not cache else ""}
"""


def start_mock(mock, latency_ms, tool_turns):
    server = subprocess.Popen(
        [mock, "--cache", "--port", "0", "--latency-ms", str(latency_ms), "--reply", "ok",
         "--tool-turns", str(tool_turns), "--no-stdin", "--max-seconds", "900"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return server, server.stdout.readline().strip().rsplit(" ", 1)[1]


def stop(server):
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run(summon, mock, fmt, latency_ms, cache, max_turns, items, tool_turns):
    """One summon run on a fresh mock; returns (wall seconds, report.json, results lines)."""
    model, price = FORMATS[fmt]
    server, addr = start_mock(mock, latency_ms, tool_turns)
    try:
        with tempfile.TemporaryDirectory() as work:
            with open(os.path.join(work, "p.yaml"), "w") as f:
                f.write(pipeline(cache, max_turns, items))
            with open(os.path.join(work, "summon.yaml"), "w") as f:
                f.write("prices:\n  " + model + ": " + json.dumps(price) + "\n")
            env = {"HOME": work, "PATH": os.environ.get("PATH", ""), "SUMMON_MODEL": model}
            if fmt == "anthropic":
                env.update(SUMMON_PROVIDER="anthropic", ANTHROPIC_BASE_URL=f"http://{addr}",
                           ANTHROPIC_API_KEY="sk-bench-0123456789abcdef")
            else:
                env.update(OPENAI_BASE_URL=f"http://{addr}/v1", OPENAI_API_KEY="sk-bench-0123456789abcdef")
            started = time.monotonic()
            done = subprocess.run([summon, "run", "p.yaml", "--out", "out", "--quiet"], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=RUN_TIMEOUT)
            wall = time.monotonic() - started
            if done.returncode != 0:
                sys.exit(f"summon run failed ({done.returncode}):\n{done.stderr}")
            with open(os.path.join(work, "out", "report.json")) as f:
                report = json.load(f)
            with open(os.path.join(work, "out", "results.jsonl")) as f:
                lines = [json.loads(l) for l in f]
            plan = None
            if cache and max_turns == 1:
                dry = subprocess.run([summon, "run", "p.yaml", "--dry-run", "--json"], cwd=work, env=env,
                                     capture_output=True, text=True, timeout=RUN_TIMEOUT, check=True)
                plan = json.loads(dry.stdout)["steps"][1]["overhead"]
            return wall, report, lines, plan
    finally:
        stop(server)


def billed(fmt, stats):
    """Input-price units of a run's input."""
    _, price = FORMATS[fmt]
    read, written = stats["cache_read_tokens"], stats["cache_write_tokens"]
    uncached = stats["input_tokens"] - read - written
    if fmt == "anthropic":
        return uncached + 1.25 * written + 0.1 * read
    return uncached + written + price["cached_input"] / price["input"] * read


def main():
    args = sys.argv[1:]
    release = "--release" in args
    args = [a for a in args if a != "--release"]
    latency_ms = int(args[0]) if args else 200
    repeats = int(args[1]) if len(args) > 1 else 3
    summon, mock = build(release)
    rows, overhead = [], {}
    for fmt in FORMATS:
        walls = {True: [], False: []}
        first = {}
        for _ in range(repeats):
            for cache in (True, False):
                wall, report, lines, plan = run(summon, mock, fmt, latency_ms, cache, 1, ITEMS, 0)
                walls[cache].append(wall)
                first.setdefault(cache, (report, lines))
                if plan is not None:
                    overhead.setdefault(fmt, (report["steps"]["each"]["overhead"], plan))
        (on, on_lines), (off, _) = first[True], first[False]
        on_t, off_t = on["total"], off["total"]
        by_start = sorted(on_lines, key=lambda l: l["started_ms"])
        readers = sum(1 for l in by_start[1:] if l["cache_read_tokens"] > 0)
        w_on, w_off = statistics.median(walls[True]), statistics.median(walls[False])
        rows.append((fmt, "fan-out", on_t, off_t, billed(fmt, on_t) / off_t["input_tokens"],
                     billed(fmt, off_t) / off_t["input_tokens"],
                     f"{readers}/{len(by_start) - 1}", f"{w_on:.2f}", f"{w_off:.2f}", f"{w_on / w_off:.3f}",
                     f"{(w_on - w_off) * 1000 / latency_ms:+.2f}",
                     f"{(w_on - w_off) * 1000 / by_start[0]['duration_ms']:+.2f}"))
        _, loop_on, _, _ = run(summon, mock, fmt, latency_ms, True, LOOP_TOOL_TURNS + 1, 1, LOOP_TOOL_TURNS)
        _, loop_off, _, _ = run(summon, mock, fmt, latency_ms, False, LOOP_TOOL_TURNS + 1, 1, LOOP_TOOL_TURNS)
        on_t, off_t = loop_on["total"], loop_off["total"]
        if on_t["turns"] != LOOP_TOOL_TURNS + 1:
            sys.exit(f"the loop took {on_t['turns']} turns")
        rows.append((fmt, "10-turn loop", on_t, off_t, billed(fmt, on_t) / off_t["input_tokens"],
                     billed(fmt, off_t) / off_t["input_tokens"], "", "", "", "", "", ""))

    print(f"{ITEMS}-item fan-out at concurrency {CONCURRENCY} and a {LOOP_TOOL_TURNS + 1}-turn loop; "
          f"mock latency L = {latency_ms} ms; wall = median of {repeats}, {'release' if release else 'debug'} build")
    head = ("format", "case", "input", "cache read", "cache write", "billed/plain", "off",
            "reads after 1st", "wall on s", "wall off s", "on/off", "+L", "+first")
    table = [head] + [(r[0], r[1], f"{r[2]['input_tokens']:,}", f"{r[2]['cache_read_tokens']:,}",
                       f"{r[2]['cache_write_tokens']:,}", f"{r[4]:.3f}", f"{r[5]:.3f}") + r[6:] for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for row in table:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")
    for r in rows:
        if r[0] == "openai":
            share = r[2]["cache_read_tokens"] / r[3]["input_tokens"]
            uncached = (r[2]["input_tokens"] - r[2]["cache_read_tokens"]) / r[3]["input_tokens"]
            print(f"openai {r[1]}: {share:.1%} of the plain input read from the cache; billed/plain would be "
                  f"{uncached + 0.1 * share:.3f} at gpt-5's 0.1x cached price, {uncached + 0.5 * share:.3f} at gpt-4o's 0.5x")
    print()
    for fmt, (measured, planned) in overhead.items():
        print(f"per-task overhead of a max_turns: 1 ad-hoc fan-out task ({fmt}, {FORMATS[fmt][0]}): "
              f"{measured['per_task_max']} tokens, {measured['tool_tokens_per_task_max']} of them tool "
              f"definitions (dry run: {planned['per_task_max']}, {planned['tool_tokens_per_task_max']})")


if __name__ == "__main__":
    main()
