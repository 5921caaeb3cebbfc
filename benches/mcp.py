#!/usr/bin/env python3
"""`summon mcp` against the CLI, with the local mock server answering after L ms (10 by default):

- a one-task `delegate` tool call in one MCP session (the official MCP Python SDK client)
  against `summon delegate` run as a process, median of R each (20 by default) after two
  warm-up calls, and their ratio;
- one `spawn_agent` call of 20 tasks (under SUMMON_MAX_BACKGROUND_TASKS, 20 here), its wall time;
- the server's resident memory (VmRSS) once initialised and idle.

    benches/mcp.py              # release build, 20 rounds, L = 10 ms
    benches/mcp.py R L_MS       # your own
    SUMMON_BIN=target/debug/summon MOCK_BIN=target/debug/summon-mock-llm benches/mcp.py

Needs the MCP Python SDK: PYTHONPATH=target/mcp-servers/py (installed by .ci/run).
"""
import asyncio, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "target", "mcp-servers", "py"))
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

WARMUP = 2


def binaries():
    if os.environ.get("SUMMON_BIN"):
        return os.environ["SUMMON_BIN"], os.environ["MOCK_BIN"]
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "summon-mock-llm", "-p", "summon"],
                   cwd=ROOT, check=True)
    release = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")
    return os.path.join(release, "summon"), os.path.join(release, "summon-mock-llm")


def start_mock(mock, latency_ms):
    server = subprocess.Popen([mock, "--lean", "--port", "0", "--latency-ms", str(latency_ms), "--no-stdin",
                               "--max-seconds", "900"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return server, server.stdout.readline().strip().rsplit(":", 1)[1]


def server_pid(summon):
    """The `summon mcp` process this script started."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == os.getpid() and args[:2] == [summon.encode(), b"mcp"]:
            return int(pid)
    return None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


async def mcp_side(summon, env, cwd, rounds):
    params = StdioServerParameters(command=summon, args=["mcp"], env=env, cwd=cwd)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await asyncio.sleep(1.0)
            rss = rss_kib(server_pid(summon))
            times = []
            for i in range(WARMUP + rounds):
                start = time.perf_counter()
                result = await session.call_tool("delegate", {"instructions": f"task {i}"})
                elapsed = time.perf_counter() - start
                if getattr(result, "is_error", getattr(result, "isError", False)):
                    sys.exit(f"delegate failed: {result.content[0].text}")
                if i >= WARMUP:
                    times.append(elapsed)
            tasks = [{"agent": None, "task": f"item {i}"} for i in range(20)]
            start = time.perf_counter()
            result = await session.call_tool("spawn_agent", {"tasks": tasks})
            spawn = time.perf_counter() - start
            head = result.content[0].text.splitlines()[0]
            return times, spawn, head, rss


def cli_side(summon, env, cwd, rounds):
    times = []
    for i in range(WARMUP + rounds):
        start = time.perf_counter()
        done = subprocess.run([summon, "delegate", "--instructions", f"task {i}"], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=60)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"summon delegate exited {done.returncode}:\n{done.stderr}")
        if i >= WARMUP:
            times.append(elapsed)
    return times


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    latency = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    summon, mock = binaries()
    summon = os.path.abspath(summon)
    server, port = start_mock(mock, latency)
    try:
        with tempfile.TemporaryDirectory() as cwd:
            env = {"PATH": os.environ.get("PATH", ""), "HOME": cwd,
                   "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "sk-bench",
                   "SUMMON_MODEL": "mock-model", "SUMMON_MAX_BACKGROUND_TASKS": "20"}
            cli = cli_side(summon, env, cwd, rounds)
            via_mcp, spawn, head, rss = asyncio.run(mcp_side(summon, env, cwd, rounds))
    finally:
        server.kill()
    med_cli, med_mcp = statistics.median(cli), statistics.median(via_mcp)
    print(f"mock latency {latency} ms, {rounds} rounds, {summon}")
    print(f"summon delegate (process)        median {med_cli * 1000:7.1f} ms  (min {min(cli) * 1000:.1f}, max {max(cli) * 1000:.1f})")
    print(f"delegate tool call (one session) median {med_mcp * 1000:7.1f} ms  (min {min(via_mcp) * 1000:.1f}, max {max(via_mcp) * 1000:.1f})")
    print(f"ratio MCP / CLI                  {med_mcp / med_cli:.2f}")
    print(f"spawn_agent, 20 tasks            {spawn * 1000:7.1f} ms  ({head})")
    print(f"server idle RSS                  {rss / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
