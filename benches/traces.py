#!/usr/bin/env python3
"""Traces benchmark: a fan-out of N single-turn tasks at concurrency C against the lean mock
(answering after L ms), with OpenTelemetry export off, on with a collector that takes the
spans, and on with the collector down (nothing listening). Prints the wall time, its ratio to
the run without export, peak RSS, and what became of the spans: the collector counts the spans
it received (OTLP/JSON, so that it can count them; http/protobuf is timed too), and a run that
lost spans says how many in its one warning.

    benches/traces.py                 # N=10000 C=256 L=100, the debug build
    benches/traces.py N C L_MS        # your own case
    SUMMON_BIN=target/release/summon benches/traces.py   # another build

The machine running it may be shared: compare ratios within one run of this script.
"""
import http.server, json, os, re, socketserver, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMON = os.environ.get("SUMMON_BIN", os.path.join(ROOT, "target/debug/summon"))
MOCK = os.environ.get("SUMMON_MOCK_BIN", os.path.join(ROOT, "target/debug/summon-mock-llm"))


class Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that answers 200 and counts what it gets."""
    spans = 0
    requests = 0
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        count = 0
        if "json" in self.headers.get("content-type", ""):
            doc = json.loads(body)
            count = sum(len(s.get("spans", [])) for r in doc.get("resourceSpans", [])
                        for s in r.get("scopeSpans", []))
        with Sink.lock:
            Sink.spans += count
            Sink.requests += 1
        self.send_response(200)
        self.send_header("content-type", self.headers.get("content-type", "application/x-protobuf"))
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class SlowSink(Sink):
    """A collector that takes 3 s to answer each request."""

    def do_POST(self):
        time.sleep(3)
        super().do_POST()


def start_sink(handler=Sink):
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(work, port, env_extra):
    env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="sk-bench",
               SUMMON_MODEL="mock-model", CI="1", **env_extra)
    for key in list(env):
        if key.startswith("OTEL_") and key not in env_extra:
            del env[key]
    started = time.monotonic()
    done = subprocess.run(["/usr/bin/time", "-v", SUMMON, "run", "fan.yaml", "--quiet", "--concurrency", C],
                          cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - started
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", done.stderr).group(1))
              for kind in ("User", "System"))
    warning = [l for l in done.stderr.splitlines() if "traces:" in l]
    return wall, cpu, rss, done.returncode, warning


N, C, L = (sys.argv[1:4] if len(sys.argv) >= 4 else ("10000", "256", "100"))
with tempfile.TemporaryDirectory() as work:
    with open(os.path.join(work, "fan.yaml"), "w") as f:
        f.write(f"""version: 1
name: bench
steps:
  - id: rows
    decompose:
      command: seq 1 {N}
  - id: each
    fan_out:
      over: rows
      instructions: "classify row {{{{ item }}}}"
    concurrency: {C}
""")
    mock = subprocess.Popen([MOCK, "--lean", "--port", "0", "--latency-ms", L, "--no-stdin", "--max-seconds", "3000"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = mock.stdout.readline().strip().rsplit(":", 1)[1]
    sink = start_sink()
    up = f"http://127.0.0.1:{sink.server_address[1]}"
    slow_sink = start_sink(SlowSink)
    slow = f"http://127.0.0.1:{slow_sink.server_address[1]}"
    down = f"http://127.0.0.1:{free_port()}"
    # Off twice, between the others, to show how much the shared machine moves the figures.
    cases = [
        ("off", {}),
        ("on, collector up (http/protobuf)", {"OTEL_EXPORTER_OTLP_ENDPOINT": up}),
        ("on, collector down", {"OTEL_EXPORTER_OTLP_ENDPOINT": down}),
        ("off, again", {}),
        ("on, collector slow (3 s a request)", {"OTEL_EXPORTER_OTLP_ENDPOINT": slow}),
        ("on, collector up (http/json)", {"OTEL_EXPORTER_OTLP_ENDPOINT": up, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}),
    ]
    print(f"{N} tasks, concurrency {C}, mock latency {L} ms, {os.path.basename(SUMMON)} at {SUMMON}")
    base = None
    cpu_base = None
    for name, extra in cases:
        before = (Sink.spans, Sink.requests)
        wall, cpu, rss, code, warning = run(work, port, extra)
        base = base or wall
        cpu_base = cpu if name == "off" else cpu_base
        got = (Sink.spans - before[0], Sink.requests - before[1])
        spans = f"collector got {got[0]} spans in {got[1]} requests" if "json" in name else \
            (f"collector got {got[1]} requests" if "up" in name or "slow" in name else "")
        print(f"  {name:34} wall {wall:6.2f} s  x{wall / base:4.2f}  CPU {cpu:6.2f} s  x{cpu / cpu_base:4.2f}"
              f"  peak RSS {rss / 1024:6.1f} MiB  exit {code}  {spans}")
        for line in warning:
            print(f"      {line}")
    mock.terminate()
    sink.shutdown()
    slow_sink.shutdown()
