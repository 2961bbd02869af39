#!/usr/bin/env python3
"""Drives `slm serve` with the official `openai` Python client, unmodified, on loopback.

Usage: openai_client.py SLM_BINARY SOURCE_DIR
Starts `slm serve` on a free port with the tiny recipe (random weights) and checks chat, completions, streaming,
the models list and an error. Prints "SKIPPED: ..." and exits 0 when the openai package is not installed.
"""
import re
import subprocess
import sys

try:
    import openai
except ImportError:
    print("SKIPPED: the openai package is not installed (pip install openai)")
    sys.exit(0)


def main():
    slm, src = sys.argv[1], sys.argv[2]
    server = subprocess.Popen(
        [slm, "serve", "--recipe", f"{src}/recipes/tiny-hybrid.json", "--random-weights",
         "--tokenizer", f"{src}/tokenizer/slm-code-512.model", "--port", "0", "--quiet"],
        stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stderr:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "the server did not report its port"
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")

        models = [m.id for m in client.models.list()]
        assert models == ["tiny-hybrid", "auto"], models

        chat = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Write a loop in C++."}], max_tokens=8,
            temperature=0)
        assert chat.choices[0].message.role == "assistant"
        assert chat.usage.completion_tokens >= 1
        assert chat.choices[0].finish_reason in ("stop", "length")

        pieces = []
        for chunk in client.chat.completions.create(
                model="tiny-hybrid", messages=[{"role": "user", "content": "Write a loop in C++."}], max_tokens=8,
                temperature=0, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        assert "".join(pieces) == chat.choices[0].message.content, (pieces, chat.choices[0].message.content)

        completion = client.completions.create(model="tiny-hybrid", prompt="int main() {", max_tokens=6, seed=3)
        assert completion.choices[0].text is not None and completion.usage.completion_tokens >= 1

        try:
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}], max_tokens=2)
            raise AssertionError("an unknown model was accepted")
        except openai.NotFoundError as e:
            assert "nope" in str(e), e
        try:
            client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}], n=2)
            raise AssertionError("n = 2 was accepted")
        except openai.BadRequestError as e:
            assert "n = 1" in str(e), e
        print(f"OK: openai {openai.__version__} against slm serve on port {port}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
