#!/usr/bin/env python3
"""A bounded loopback load test of `slm serve`: C concurrent clients x R requests each, alternating streamed and
whole answers, standard library only. Reports errors, requests/s, tokens/s, latency and time-to-first-token
percentiles (first token: the first content event of a stream).

  python3 bench/serve_load.py --url http://127.0.0.1:8000 --clients 16 --requests 50 --max-tokens 16 [--mixed]
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


# --mixed: requests of every domain, so that `auto` spreads them over the specialists.
MIXED = [
    "Write a C++ function that returns the sum of a std::vector<int>.",
    "How do I link a library to a target in CMakeLists.txt?",
    "Write a bash script that counts the lines of every .cpp file in a directory.",
    "AddressSanitizer: heap-use-after-free on address 0x602000000010. What went wrong?",
    "Review this change: -  for (int i = 0; i <= n; ++i)\n+  for (int i = 0; i < n; ++i)",
    "Describe the design of a thread pool with a work-stealing queue.",
    "Implement Dijkstra's shortest path algorithm with a binary heap.",
    "Plan the steps to add a new specialist to the ensemble.",
]


def one(url, model, max_tokens, stream, i, content=None):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": i, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {}),
                       "messages": [{"role": "user", "content": content or f"Request {i}: write a C++ function."}]})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    first, tokens = None, 0
    if r.status != 200:
        r.read()
        return r.status, time.perf_counter() - t0, None, 0
    if stream:
        buf = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                data = ev[6:]
                if data == b"[DONE]":
                    continue
                j = json.loads(data)
                if j["choices"] and j["choices"][0]["delta"].get("content") and first is None:
                    first = time.perf_counter() - t0
                if j.get("usage"):
                    tokens = j["usage"]["completion_tokens"]
    else:
        tokens = json.loads(r.read())["usage"]["completion_tokens"]
    conn.close()
    return 200, time.perf_counter() - t0, first, tokens


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--url", default="http://127.0.0.1:8000")
    a.add_argument("--model", default="auto")
    a.add_argument("--clients", type=int, default=16)
    a.add_argument("--requests", type=int, default=50)
    a.add_argument("--max-tokens", type=int, default=16)
    a.add_argument("--mixed", action="store_true", help="requests of all eight domains in turn (see MIXED)")
    o = a.parse_args()
    results, lock = [], threading.Lock()

    def client(c):
        for k in range(o.requests):
            i = c * o.requests + k
            try:
                r = one(o.url, o.model, o.max_tokens, i % 2 == 0, i, MIXED[i % len(MIXED)] if o.mixed else None)
            except Exception as e:  # a refused or broken connection counts as an error
                r = (str(e), 0, None, 0)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(o.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r[0] == 200]
    lat = [r[1] for r in ok]
    ttft = [r[2] for r in ok if r[2] is not None]
    tokens = sum(r[3] for r in ok)
    print(f"{len(results)} requests ({o.clients} clients x {o.requests}), {len(results) - len(ok)} errors, "
          f"{wall:.1f} s: {len(ok) / wall:.1f} requests/s, {tokens / wall:.0f} generated tokens/s")
    print(f"latency p50 {pct(lat, 50) * 1000:.0f} ms, p99 {pct(lat, 99) * 1000:.0f} ms; "
          f"time to first token (streams) p50 {pct(ttft, 50) * 1000:.0f} ms, p99 {pct(ttft, 99) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
