"""What the Python tests of `slm serve` share: the server as a child process on a free loopback port, and the test-only
packages (scripts/test-deps.sh puts them in .venv-test/, whose python the tests run).

Nothing here sleeps: the port comes from the server's own "listening on" line, read with a deadline.
"""
import importlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def require(*modules):
    """Imports the test-only packages, or fails the test (exit 1) naming the script that installs them."""
    loaded = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as e:
            print(f"FAILED: cannot import {name} with {sys.executable} ({e}): run scripts/test-deps.sh, which installs "
                  "the test-only Python packages into .venv-test/ (and chromium, chromium-driver)")
            sys.exit(1)
    return loaded[0] if len(loaded) == 1 else loaded


def tiny_model_args(src):
    """The tiny hybrid recipe on seeded random weights with the 512-id code tokenizer: loads in a second."""
    return ["--recipe", f"{src}/recipes/tiny-hybrid.json", "--random-weights",
            "--tokenizer", f"{src}/tokenizer/slm-code-512.model"]


class SlmServe:
    """`slm serve ARGS --port 0 --quiet` until close(); .port and .url once it listens."""

    def __init__(self, slm, args, start_timeout_s=120):
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env.pop("SLM_API_KEY", None)  # the server would require it
        self.proc = subprocess.Popen([slm, "serve", *args, "--port", "0", "--quiet"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        lines = queue.Queue()

        def drain():  # keeps reading, so a chatty server never blocks on a full pipe
            for line in self.proc.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, daemon=True).start()
        self.port = None
        deadline = time.monotonic() + start_timeout_s
        try:
            while self.port is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"slm serve did not listen within {start_timeout_s} s: {''.join(self.log)}")
                try:
                    line = lines.get(timeout=left)
                except queue.Empty:
                    continue
                if line is None:
                    raise AssertionError(f"slm serve exited ({self.proc.wait()}) before listening: {''.join(self.log)}")
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def post(self, path, body, timeout=120):
        """(status, headers, body bytes) of a JSON POST; HTTP errors are returned, not raised."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def get_json(self, path, timeout=60):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.load(r)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sse_events(body):
    """The JSON payloads of a server-sent event stream, checking its framing: "data: X\\n\\n" each, [DONE] last."""
    text = body.decode()
    assert text.endswith("\n\n"), text[-200:]
    events = text[:-2].split("\n\n")
    assert events[-1] == "data: [DONE]", events[-1]
    out = []
    for ev in events[:-1]:
        assert ev.startswith("data: "), ev
        out.append(json.loads(ev[len("data: "):]))
    return out
