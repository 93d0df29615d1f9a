#!/usr/bin/env python3
"""Hostile clients against a running llama-serve, one attack at a time:
a short request's latency beside each attack (median and worst of its
tries) against the same request unloaded, and the server's resident memory
before and after. Talks only to 127.0.0.1 (and 127.0.0.2, loopback too),
bounded in count and time.

    python3 scripts/hostile_probe.py --server target/debug/llama-serve --model M.gguf
"""

import argparse
import json
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request


def post(base, path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:  # a dropped connection, a timeout
        return 0, str(e).encode()


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def short(base, source="127.0.0.1"):
    """The short request's latency, sent from `source` (another loopback
    address is another client)."""
    import http.client
    host, port = base.removeprefix("http://").split(":")
    started = time.time()
    conn = http.client.HTTPConnection(host, int(port), timeout=120, source_address=(source, 0))
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 8, "temperature": 0}),
                 {"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    assert status == 200, status
    return time.time() - started


def latencies(base, tries):
    return [short(base) for _ in range(tries)]


def recursive_schema():
    pad = {f"p{i}": {"type": "integer", "minimum": i} for i in range(100)}
    defs = {f"d{i}": {"type": "object", "properties": {"next": {"$ref": f"#/$defs/d{i}"}, "pad": {"type": "object", "properties": pad}}} for i in range(200)}
    return {"$defs": defs, "type": "object", "properties": {f"x{i}": {"$ref": f"#/$defs/d{i}"} for i in range(200)}}


def attacks(base, port):
    alternatives = " | ".join(f'"zq{i:04}x"' for i in range(2048))
    expensive = f'root ::= word " " word\nword ::= {alternatives}'

    def loop(send):
        def run(stop):
            while not stop.is_set():
                send()
        return run

    def idle_connections(stop):
        held = []
        for _ in range(200):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                held.append(s)
            except OSError:
                break
        stop.wait()
        for s in held:
            s.close()

    def one(body, path="/v1/completions"):
        return lambda: post(base, path, body)

    def chat(body):
        return one(body, "/v1/chat/completions")

    def rebinding():
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n")
        reply = s.recv(64)
        s.close()
        assert b" 403 " in reply, reply
        time.sleep(0.01)

    return [
        ("GBNF 1,000-byte literal {2000}", loop(one({"prompt": "a", "max_tokens": 4, "grammar": 'root ::= "' + "x" * 1000 + '"{2000}'}))),
        ("GBNF nested repetitions", loop(one({"prompt": "a", "max_tokens": 4, "grammar": 'root ::= (((("a"+)+)+)+)'}))),
        ("schema: 200 recursive targets", loop(chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"schema": recursive_schema()}}}))),
        ("grammar of 2,048 alternatives", loop(one({"prompt": "Some words:", "max_tokens": 16, "grammar": expensive}))),
        # Load, to compare with the next one: the same requests without
        # stop strings.
        ("(load) n=4, 32 tokens, no stop strings", loop(one({"prompt": "Tell a story", "max_tokens": 32, "n": 4}))),
        ("32 stop strings of 256 bytes, n=4", loop(one({"prompt": "Tell a story", "max_tokens": 32, "n": 4,
            "stop": [chr(65 + i % 26) * 256 for i in range(32)]}))),
        ("33 stop strings (refused)", loop(one({"prompt": "a", "max_tokens": 4, "stop": [f"s{i}" for i in range(33)]}))),
        ("DNS rebinding Host", loop(rebinding)),
        ("200 idle connections from one address", idle_connections),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0, help="the longest one attack runs")
    args = ap.parse_args()
    server = subprocess.Popen([args.server, "--model", args.model, "--port", "0", "--threads", "2", "--shutdown-grace", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        probe(args, server)
    finally:
        # Whatever failed, the server does not outlive the probe.
        if server.poll() is None:
            server.kill()
            server.wait()


def probe(args, server):
    base = server.stdout.readline().strip().split()[-1]
    port = int(base.rsplit(":", 1)[1])
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                break
        except Exception:
            time.sleep(0.1)
    short(base)  # warm
    alone = latencies(base, args.tries)
    base_median = statistics.median(alone)
    rss0 = rss_mb(server.pid)
    print(f"unloaded: median {base_median:.3f} s, worst {max(alone):.3f} s; RSS {rss0:.0f} MB")
    ok = True
    for name, attack in attacks(base, port):
        stop = threading.Event()
        workers = [threading.Thread(target=attack, args=(stop,), daemon=True) for _ in range(2 if name != "200 idle connections from one address" else 1)]
        for w in workers:
            w.start()
        time.sleep(1.0)
        started = time.time()
        tries = []
        # The connection hog holds 127.0.0.1's connections: the short
        # request is another client.
        source = "127.0.0.2" if name.startswith("200 idle") else "127.0.0.1"
        while len(tries) < args.tries and time.time() - started < args.seconds:
            tries.append(short(base, source))
        stop.set()
        for w in workers:
            w.join(timeout=120)
        rss = rss_mb(server.pid)
        bound = 3 * base_median + 1
        # Load is load: the stop strings are compared with the same load.
        if name.startswith("(load)"):
            load_median = statistics.median(tries)
        if name.startswith("32 stop"):
            bound = 3 * load_median + 1
        within = max(tries) <= bound and rss - rss0 < 256
        ok &= within
        print(f"{name}: median {statistics.median(tries):.3f} s, worst {max(tries):.3f} s (bound {bound:.2f} s); "
              f"RSS {rss:.0f} MB (+{rss - rss0:.0f}) {'ok' if within else 'OVER'}")
    # SIGTERM while the expensive grammar is sampled.
    alternatives = " | ".join(f'"zq{i:04}x"' for i in range(2048))
    threading.Thread(target=lambda: post(base, "/v1/completions", {"prompt": "Some words:", "max_tokens": 64,
                     "grammar": f'root ::= word " " word\nword ::= {alternatives}'}), daemon=True).start()
    time.sleep(2.0)
    started = time.time()
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)
    took = time.time() - started
    ok &= took <= 2.0
    print(f"SIGTERM during the expensive grammar: exited in {took:.2f} s (grace 1 s, bound 2 s), code {server.returncode}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
