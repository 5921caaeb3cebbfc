#!/usr/bin/env python3
"""At the provider's ceiling: how many tasks a minute a fan-out finishes against a key that is
rationed the way OpenAI and Anthropic ration one, side by side with the providers' Python SDKs
and LiteLLM in the same sitting.

A 600-row CSV of one-line ticket labels is fanned out at concurrency 64 (a `decompose: file:`
step and a `fan_out` with inline instructions) against `summon-mock-llm` answering 200 ms after
each request it admits and rationing its one key (the mock's `ration` module):
  - OpenAI:    `--ration-openai 6000,300000` (6,000 requests and 300,000 tokens a minute; a
               request costs the larger of its max_tokens and its input, characters / 4, at
               admission, and nothing comes back);
  - Anthropic: `--ration-anthropic 4000,200000,40000` (4,000 requests, 200,000 input and 40,000
               output tokens a minute; max_tokens is held until the answer ends).
Each client gets a fresh mock (full buckets) started with `--cache`, and runs:
  1. `summon`, its defaults: `summon run fan.yaml --concurrency 64 --out DIR` (with
     `local: false` on the provider in summon.yaml: the mock on 127.0.0.1 stands for the
     hosted API, whose URL says so by itself);
  2. `summon lean`: `extensions: []` in the step and `--max-output-tokens 64`;
  3. the provider's SDK in a 20-line asyncio loop (a semaphore of 64, the same prompt as the
     user message, no system prompt): OpenAI's `AsyncOpenAI` without max_tokens; Anthropic's
     `AsyncAnthropic` with max_tokens 1024, because its API requires one;
  4. LiteLLM's `acompletion` in the same loop, with max_tokens 1024 for Anthropic as the SDK
     (given none, LiteLLM sends the model's largest output, 64,000 for claude-sonnet-4-5: more
     than a minute of this key's output tokens, so every request is refused).
The SDK loops ask for up to 8 retries of a 429 (the SDKs' default is 2), LiteLLM too
(`num_retries=8`, which in the version pinned did not retry Anthropic's 429s); a task still
failing is counted in "lost", as is a summon task that did not complete.

For each: wall time (summon: the whole process; the Python loops: from the first request to
the last answer, imports excluded), tasks a minute (600 / wall), requests sent and 429s (the
mock's counts), tokens charged per limit (the mock's counts: OpenAI's tokens; Anthropic's input
and output tokens, output settled to what the answers used), and the ratio of wall time to the
least time the key's limits allow for the tokens charged:

    least = max( ceil(600 / 64) x 0.2 s,
                 max over the limits d of (charged_d - limit_d) / (limit_d / 60 s) )

where the limits are requests (charged: requests admitted) and tokens (OpenAI), or requests,
input tokens and output tokens (Anthropic); limit_d is the per-minute limit, which a full
bucket lets through at once (one minute's burst), and limit_d / 60 s its refill rate. A ratio
of 1 is the fastest the key allows for the work as sent; the ideal of a client that sends less
per task is lower (compare the tokens a task).

    benches/ceiling.py                  # every client, both accountings
    benches/ceiling.py openai|anthropic # one accounting
    CLIENTS=summon,sdk benches/ceiling.py   # some clients (summon, lean, sdk, litellm)

The Python clients are installed on first use into a venv, target/bench-venv (pinned below).
SUMMON=path runs another summon binary, MOCK=path another summon-mock-llm; NO_BUILD=1 builds nothing (the release binaries are
there). Every run has a timeout (RUN_TIMEOUT seconds, default 900) and the mock stops by itself
(`--max-seconds`).
"""
import json, math, os, re, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fanout import ROOT, build

N, C, LATENCY_MS = 600, 64, 200
RUN_TIMEOUT = int(os.environ.get("RUN_TIMEOUT", "900"))
PINS = ["openai==3.63.0", "anthropic==2.17.0", "litellm==1.110.2"]
VENV = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "bench-venv")
ACCOUNTINGS = {
    "openai": {"flag": ["--ration-openai", "6000,300000"], "limits": {"requests": 6000, "tokens": 300000}},
    "anthropic": {"flag": ["--ration-anthropic", "4000,200000,40000"],
                  "limits": {"requests": 4000, "input tokens": 200000, "output tokens": 40000}},
}
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-sonnet-4-5"}
INSTRUCTIONS = "Label this support ticket with one word (bug, billing, account, feature or other): {{ item.text }}"
SUBJECTS = ["Cannot log in after the password reset", "Charged twice for the March invoice",
            "Export to CSV drops the last column", "Please add dark mode to the dashboard",
            "Two-factor codes arrive late", "Refund for the annual plan", "App crashes when I rotate the phone",
            "How do I change the billing email", "Search ignores accented letters", "Invite link has expired",
            "Webhook retries flood our server", "Feature request: bulk archive", "Account locked after three tries",
            "Invoice shows the wrong VAT number", "Timezone wrong in the weekly report", "Delete my account and data"]


def rows():
    """The 600 one-line ticket labels."""
    return [f"#{1000 + i}: {SUBJECTS[i % len(SUBJECTS)]} (customer {i * 7919 % 977})" for i in range(N)]


def prompt(text):
    """The task as the Python loops send it: the step's instructions with the row filled in."""
    return INSTRUCTIONS.replace("{{ item.text }}", text)


def venv_python():
    """The venv's python, with the pinned clients installed (once)."""
    python = os.path.join(VENV, "bin", "python")
    stamp = os.path.join(VENV, "pins.txt")
    if os.path.exists(stamp) and open(stamp).read() == "\n".join(PINS):
        return python
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", *PINS], check=True, timeout=1800)
    with open(stamp, "w") as f:
        f.write("\n".join(PINS))
    return python


# The Python loops: argv is KIND URL MODEL PROMPTS_FILE; prints {"wall": s, "done": n, "lost": n}.
LOOP = r'''
import asyncio, json, os, sys, time
kind, url, model, prompts = sys.argv[1], sys.argv[2], sys.argv[3], json.load(open(sys.argv[4]))
if kind == "openai-sdk":
    from openai import AsyncOpenAI
    client = AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=8)
    ask = lambda p: client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}])
elif kind == "anthropic-sdk":
    from anthropic import AsyncAnthropic
    client = AsyncAnthropic(base_url=url, api_key="sk-ant-bench", max_retries=8)
    ask = lambda p: client.messages.create(model=model, max_tokens=1024, messages=[{"role": "user", "content": p}])
else:
    import litellm
    # For Anthropic the same 1,024 as the SDK: without one LiteLLM sends the model's maximum.
    cap = {"max_tokens": 1024} if model.startswith("anthropic/") else {}
    ask = lambda p: litellm.acompletion(model=model, api_base=url, api_key="sk-bench", num_retries=8,
                                        messages=[{"role": "user", "content": p}], **cap)
async def main():
    gate, lost = asyncio.Semaphore(64), 0
    async def one(p):
        nonlocal lost
        async with gate:
            try:
                await ask(p)
            except Exception as err:
                lost += 1
                print(f"lost: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    print(json.dumps({"wall": time.perf_counter() - start, "done": len(prompts) - lost, "lost": lost}))
asyncio.run(main())
'''


def start_mock(mock, accounting):
    """A fresh rationing mock (the full server, prompt caching on); returns it and its port."""
    server = subprocess.Popen([mock, "--port", "0", "--latency-ms", str(LATENCY_MS), "--cache", "--no-stdin",
                               "--max-seconds", str(RUN_TIMEOUT + 60)] + ACCOUNTINGS[accounting]["flag"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = server.stdout.readline().strip()
    if not line.startswith("listening on "):
        server.kill()
        sys.exit(f"the mock did not start: {line} {server.stderr.read()[-2000:]}")
    return server, line.rsplit(":", 1)[1]


def stop_mock(server):
    """Stops the mock; returns what it says the rationing did."""
    server.terminate()
    try:
        _, errors = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        _, errors = server.communicate()
    found = re.search(r"ration: admitted (\d+), 429s (\d+) .*charged: tokens (\d+), input tokens (\d+), "
                      r"output tokens (\d+) \(held (\d+)\)", errors)
    if not found:
        sys.exit(f"the mock did not say what it rationed: {errors[-2000:]}")
    admitted, limited, tokens, input_tokens, output_tokens, held = map(int, found.groups())
    return {"admitted": admitted, "limited": limited, "tokens": tokens, "input tokens": input_tokens,
            "output tokens": output_tokens, "held": held}


def write_pipeline(work, lean):
    with open(os.path.join(work, "tickets.csv"), "w") as f:
        f.write("id,text\n")
        for i, text in enumerate(rows()):
            f.write(f'{i},"{text}"\n')
    extensions = "\n      extensions: []" if lean else ""
    with open(os.path.join(work, "fan.yaml"), "w") as f:
        f.write(f"""version: 1
name: ceiling
steps:
  - id: tickets
    decompose:
      file: tickets.csv
  - id: labels
    fan_out:
      over: tickets
      instructions: "{INSTRUCTIONS}"{extensions}
    on_error: continue
""")


def run_summon(summon, accounting, port, lean):
    """One summon run; returns (wall, tasks completed)."""
    with tempfile.TemporaryDirectory() as work:
        write_pipeline(work, lean)
        # The mock stands for the hosted API; on 127.0.0.1 summon would take it for a local
        # server and send its runaway guard (4,096 output tokens) on a fan-out's first wave.
        # `local: false` says what the hosted API's URL says by itself.
        with open(os.path.join(work, "summon.yaml"), "w") as f:
            f.write(f"providers:\n  {accounting}:\n    local: false\n")
        env = dict(os.environ, CI="1", SUMMON_MODEL=MODELS[accounting])
        if accounting == "openai":
            env.update(SUMMON_PROVIDER="openai", OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1",
                       OPENAI_API_KEY="sk-bench")
        else:
            env.update(SUMMON_PROVIDER="anthropic", ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}",
                       ANTHROPIC_API_KEY="sk-ant-bench")
        extra = ["--max-output-tokens", "64"] if lean else []
        start = time.perf_counter()
        proc = subprocess.run([summon, "run", "fan.yaml", "--concurrency", str(C), "--out", "out"] + extra,
                              cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=RUN_TIMEOUT)
        wall = time.perf_counter() - start
        results = os.path.join(work, "out", "results.jsonl")
        lines = [json.loads(l) for l in open(results)] if os.path.exists(results) else []
        done = sum(1 for l in lines if l.get("status") == "completed")
        if proc.returncode != 0 and done == 0:
            sys.exit(f"summon failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return wall, done


def run_python(python, kind, accounting, port):
    """One Python loop; returns (wall, tasks completed)."""
    with tempfile.TemporaryDirectory() as work:
        prompts = os.path.join(work, "prompts.json")
        json.dump([prompt(t) for t in rows()], open(prompts, "w"))
        script = os.path.join(work, "loop.py")
        open(script, "w").write(LOOP)
        if kind == "litellm":
            url = f"http://127.0.0.1:{port}" + ("/v1" if accounting == "openai" else "")
            model = f"{accounting}/{MODELS[accounting]}"
        else:
            kind = f"{accounting}-sdk"
            url = f"http://127.0.0.1:{port}" + ("/v1" if accounting == "openai" else "")
            model = MODELS[accounting]
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False")
        proc = subprocess.run([python, script, kind, url, model, prompts], env=env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT)
        if proc.returncode != 0:
            sys.exit(f"{kind} loop failed ({proc.returncode}): {proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        return out["wall"], out["done"]


def least_time(accounting, stats):
    """The least time the key's limits allow for what was charged (see the module doc)."""
    bound = math.ceil(N / C) * LATENCY_MS / 1000
    charged = dict(stats, requests=stats["admitted"])
    for dimension, limit in ACCOUNTINGS[accounting]["limits"].items():
        bound = max(bound, (charged[dimension] - limit) / (limit / 60))
    return bound


def main():
    accountings = [a for a in sys.argv[1:] if a in ACCOUNTINGS] or list(ACCOUNTINGS)
    clients = os.environ.get("CLIENTS", "summon,lean,sdk,litellm").split(",")
    summon, mock, _ = build()
    summon, mock = os.path.abspath(summon), os.path.abspath(os.environ.get("MOCK", mock))
    python = venv_python() if {"sdk", "litellm"} & set(clients) else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"{N} tasks, C={C}, answers after {LATENCY_MS} ms; summon {summon} (tree at {commit}); {', '.join(PINS)}")
    print()
    print("| limits | client | wall (s) | tasks a minute | lost | requests | 429s | tokens charged "
          "| tokens a task | held / request | least (s) | wall / least |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for accounting in accountings:
        for client in clients:
            server, port = start_mock(mock, accounting)
            try:
                if client in ("summon", "lean"):
                    wall, done = run_summon(summon, accounting, port, client == "lean")
                else:
                    wall, done = run_python(python, client, accounting, port)
            finally:
                stats = stop_mock(server)
            least = least_time(accounting, stats)
            if accounting == "openai":
                charged = f"{stats['tokens']:,}"
                per_task = f"{stats['tokens'] / max(done, 1):,.0f}"
                held = "-"
            else:
                charged = f"{stats['input tokens']:,} in, {stats['output tokens']:,} out"
                per_task = (f"{stats['input tokens'] / max(done, 1):,.0f} in, "
                            f"{stats['output tokens'] / max(done, 1):,.0f} out")
                held = f"{stats['held'] / max(stats['admitted'], 1):,.0f}"
            name = {"summon": "summon, defaults", "lean": "summon, `extensions: []`, `--max-output-tokens 64`",
                    "sdk": f"{accounting.capitalize() if accounting == 'anthropic' else 'OpenAI'} SDK loop",
                    "litellm": "LiteLLM loop"}[client]
            limits = ACCOUNTINGS[accounting]["flag"][1]
            print(f"| {accounting} {limits} | {name} | {wall:.1f} | {done / wall * 60:,.0f} | {N - done} "
                  f"| {stats['admitted'] + stats['limited']} | {stats['limited']} | {charged} | {per_task} "
                  f"| {held} | {least:.1f} | {wall / least:.2f} |", flush=True)


if __name__ == "__main__":
    main()
