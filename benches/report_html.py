#!/usr/bin/env python3
"""report.html at scale: writes an output directory of N tasks (results.jsonl lines shaped as
summon writes them: an item object, a prompt, an output of a few hundred bytes, one task in ten
failed, one in five with a tool call, one in fifty retried; report.json with its per-step
numbers and step graph), builds the page with `summon report DIR`, and loads it in headless
Chromium. Prints, per N: the sizes of results.jsonl and report.html and their ratio, the time
`summon report` takes and its peak RSS, the time from navigation to the first table page drawn (the page's own
`performance.now()`, which it leaves in `data-render-ms`), and the wall time of a headless
Chromium that loads the page and dumps its DOM, next to one that loads an empty page.

    benches/report_html.py              # N = 1,000, 10,000 and 100,000
    benches/report_html.py N [N ...]    # your own sizes

Uses the debug build of summon (building it first); SUMMON=path picks another binary and
CHROMIUM=path another browser.
"""
import json, os, random, re, shutil, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summon_binary():
    if os.environ.get("SUMMON"):
        return os.environ["SUMMON"]
    subprocess.run(["cargo", "build", "--quiet", "--bin", "summon"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "debug", "summon")


def chromium_binary():
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") \
        or shutil.which("google-chrome")
    if not found:
        sys.exit("no chromium on PATH (apt-get install chromium)")
    return found


WORDS = ("api auth billing cache cli config docs errors export import install logging metrics "
         "migration network parser queue release search security storage sync tests ui").split()


def write_run(dir, n):
    """An output directory of n fan-out tasks and one synthesis."""
    rnd = random.Random(n)
    os.makedirs(dir, exist_ok=True)
    tokens_in = tokens_out = failed = 0
    t = 0
    with open(os.path.join(dir, "results.jsonl"), "w") as f:
        for i in range(n):
            area = rnd.choice(WORDS)
            ok = i % 10 != 3
            retried = i % 50 == 7
            tools = [{"name": "shell", "ok": True, "summary": f"src/{area}/mod.rs"}] if i % 5 == 1 else []
            duration = rnd.randint(800, 9000)
            start = t + rnd.randint(0, 40)
            t = start if i % 64 else start + duration
            line = {
                "step": "notes", "index": i, "item": {"id": f"T-{i:06d}", "area": area},
                "status": "completed" if ok else "failed",
                "output": (f"Release notes for {area}: " + " ".join(rnd.choice(WORDS) for _ in range(40))) if ok else "",
                "error": None if ok else "HTTP 400: this item is bad (invalid_request_error)",
                "turns": 1 + len(tools), "input_tokens": 900 + rnd.randint(0, 400),
                "output_tokens": 120 + rnd.randint(0, 80) if ok else 0,
                "duration_ms": duration, "resumed": False, "reused": False, "extracted": False,
                "corrections": 0, "started_ms": start, "attempts": 1,
                "retries": 1 if retried else 0, "rate_limited": 1 if retried else 0,
                "retry_wait_ms": 2000 if retried else 0, "tools": tools,
                "prompt": f"Write the release notes for the area {area} of ticket T-{i:06d}, "
                          "in the house style, citing the changed files.",
            }
            tokens_in += line["input_tokens"]
            tokens_out += line["output_tokens"]
            failed += 0 if ok else 1
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
        end = t + 9000
        f.write(json.dumps({"step": "summary", "index": 0, "item": None, "status": "completed",
                            "output": "All notes.", "error": None, "turns": 1, "input_tokens": 5000,
                            "output_tokens": 800, "duration_ms": 6000, "resumed": False,
                            "reused": False, "extracted": False, "corrections": 0,
                            "started_ms": end, "attempts": 1, "retries": 0, "rate_limited": 0,
                            "retry_wait_ms": 0, "tools": [], "prompt": "Merge the notes."}) + "\n")

    def stats(tasks, completed, failed, tin, tout, wall):
        return {"tasks": tasks, "completed": completed, "failed": failed, "skipped": 0, "resumed": 0,
                "reused": 0, "corrections": 0, "turns": tasks, "input_tokens": tin, "output_tokens": tout,
                "duration_ms": {"sum": 0, "max": 0}, "wall_ms": wall,
                "cost_usd": round((tin * 0.15 + tout * 0.6) / 1e6, 6), "priced": True, "unpriced_tasks": 0}

    report = {
        "version": 1, "started_at": "2026-01-31T12:00:00Z", "wall_ms": end + 6000,
        "total": stats(n + 1, n + 1 - failed, failed, tokens_in + 5000, tokens_out + 800, end + 6000),
        "steps": {"areas": stats(0, 0, 0, 0, 0, 20),
                  "notes": stats(n, n - failed, failed, tokens_in, tokens_out, end),
                  "summary": stats(1, 1, 0, 5000, 800, 6000)},
        "retries_by_class": {"rate_limited": n // 50, "server_error": 0, "connection": 0, "timeout": 0,
                             "invalid_response": 0},
        "pipeline": {"name": "release-notes", "run_id": "bench", "steps": [
            {"id": "areas", "kind": "decompose", "needs": [], "status": "succeeded"},
            {"id": "notes", "kind": "fan_out", "needs": ["areas"], "status": "succeeded"},
            {"id": "summary", "kind": "synthesize", "needs": ["notes"], "status": "succeeded"}]},
    }
    with open(os.path.join(dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)


def headless(chromium, profile, url):
    """Loads url in headless Chromium and dumps its DOM; returns (seconds, DOM)."""
    started = time.monotonic()
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=60000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=300)
    return time.monotonic() - started, done.stdout


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10000, 100000]
    summon, chromium = summon_binary(), chromium_binary()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "profile")
        empty = os.path.join(tmp, "empty.html")
        with open(empty, "w") as f:
            f.write("<!DOCTYPE html><title>empty</title>")
        headless(chromium, profile, "file://" + empty)  # a first start warms the profile
        baseline, _ = headless(chromium, profile, "file://" + empty)
        for n in sizes:
            dir = os.path.join(tmp, f"out{n}")
            write_run(dir, n)
            started = time.monotonic()
            proc = subprocess.Popen([summon, "report", dir], stdout=subprocess.DEVNULL)
            _, status, usage = os.wait4(proc.pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit(f"N={n}: summon report failed")
            build = time.monotonic() - started
            results = os.path.getsize(os.path.join(dir, "results.jsonl"))
            page = os.path.getsize(os.path.join(dir, "report.html"))
            wall, dom = headless(chromium, profile, "file://" + os.path.join(dir, "report.html") + "#status=failed")
            rendered = re.search(r'data-render-ms="(\d+)"', dom)
            shown = re.search(r'id="task-count">(\d+)<', dom)
            if not rendered or not shown or int(shown.group(1)) != n + 1:
                sys.exit(f"N={n}: the page did not render (count {shown and shown.group(1)})")
            held = re.search(r'This page holds (\d+) of the (\d+) tasks', dom)
            if held:
                print(f"N={n}: the page holds {held.group(1)} of {held.group(2)} tasks, and says so", flush=True)
            rows.append((n, results, page, build, usage.ru_maxrss / 1024, int(rendered.group(1)) / 1000, wall))
    print(f"{'tasks':>8} {'results.jsonl':>14} {'report.html':>12} {'ratio':>6} {'summon report':>14} "
          f"{'its peak RSS':>13} {'page drawn':>11} {'chromium load+dump':>19}")
    for n, results, page, build, rss, drawn, wall in rows:
        print(f"{n:>8} {results / 1e6:>11.1f} MB {page / 1e6:>9.1f} MB {page / results:>6.2f} {build:>12.2f} s "
              f"{rss:>9.1f} MiB {drawn:>9.2f} s {wall:>10.2f} s (empty page {baseline:.2f} s)")


if __name__ == "__main__":
    main()
