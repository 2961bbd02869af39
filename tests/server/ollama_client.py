#!/usr/bin/env python3
"""Drives `slm serve` with the official `ollama` Python client, unmodified, on loopback.

Usage: ollama_client.py SLM_BINARY SOURCE_DIR
Starts `slm serve` on a free port with the tiny recipe (random weights) and checks list(), show() (a template with
.Suffix), generate() with a suffix non-streamed and streamed (greedy: the pieces make the same text), chat() both
ways, the load request, and an unknown model (ResponseError 404). Fails (exit 1) naming scripts/test-deps.sh when the
ollama package is missing.
"""
import importlib.metadata
import json
import sys

from slm_serve import SlmServe, require, tiny_model_args

ollama = require("ollama")

GREEDY = {"num_predict": 8, "temperature": 0, "seed": 7}


def main():
    slm, src = sys.argv[1], sys.argv[2]
    with SlmServe(slm, tiny_model_args(src)) as server:
        client = ollama.Client(host=server.url, timeout=120)

        names = [m.model for m in client.list().models]
        assert names == ["tiny-hybrid", "auto"], names
        first = client.list().models[0]
        assert first.size > 0 and len(first.digest) == 64, first
        assert first.details.format == "safetensors" and first.details.parameter_size, first.details

        shown = client.show("tiny-hybrid")
        assert ".Suffix" in shown.template, shown.template
        assert shown.capabilities == ["completion", "insert"], shown.capabilities
        assert shown.modelinfo["slm.context_length"] > 0, shown.modelinfo

        prefix, suffix = "int add(int a, int b) {\n  return ", ";\n}\n"
        whole = client.generate(model="tiny-hybrid", prompt=prefix, suffix=suffix, options=GREEDY)
        assert whole.done and whole.done_reason in ("stop", "length"), whole
        assert whole.response and whole.eval_count >= 1 and whole.prompt_eval_count > 0, whole
        assert whole.total_duration >= whole.eval_duration > 0, whole
        pieces = list(client.generate(model="tiny-hybrid", prompt=prefix, suffix=suffix, options=GREEDY,
                                      stream=True))
        assert all(not p.done for p in pieces[:-1]) and pieces[-1].done, pieces
        assert pieces[-1].response == "" and pieces[-1].eval_count == whole.eval_count, pieces[-1]
        streamed = "".join(p.response for p in pieces)
        assert streamed == whole.response, (streamed, whole.response)

        messages = [{"role": "user", "content": "Write a loop in C++."}]
        chat = client.chat(model="auto", messages=messages, options=GREEDY)
        assert chat.message.role == "assistant" and chat.message.content and chat.done, chat
        parts = list(client.chat(model="tiny-hybrid", messages=messages, options=GREEDY, stream=True))
        assert parts[-1].done and parts[-1].done_reason == chat.done_reason, parts[-1]
        assert "".join(p.message.content for p in parts) == chat.message.content, (parts, chat.message.content)

        loaded = client.generate(model="tiny-hybrid")  # an empty prompt: Ollama's "load the model"
        assert loaded.done and loaded.done_reason == "load" and loaded.response == "", loaded

        try:
            client.generate(model="nope", prompt="x", options=GREEDY)
            raise AssertionError("an unknown model was accepted")
        except ollama.ResponseError as e:
            assert e.status_code == 404 and "nope" in e.error, (e.status_code, e.error)
        try:
            client.generate(model="tiny-hybrid", prompt="x", format="json")
            raise AssertionError("format json was accepted")
        except ollama.ResponseError as e:
            assert e.status_code == 400 and "format" in e.error, (e.status_code, e.error)

        # What Continue's autocomplete sends (raw, the suffix, keep_alive), through plain HTTP: NDJSON lines.
        status, headers, body = server.post("/api/generate", {
            "model": "tiny-hybrid", "prompt": prefix, "suffix": suffix, "raw": True, "keep_alive": 1800,
            "options": {"num_predict": 8, "temperature": 0, "num_ctx": shown.modelinfo["slm.context_length"]}})
        assert status == 200 and headers["Content-Type"] == "application/x-ndjson", (status, headers)
        lines = [json.loads(x) for x in body.decode().splitlines()]
        assert "".join(x["response"] for x in lines) == whole.response, lines
        print(f"OK: ollama {importlib.metadata.version('ollama')} against slm serve on port {server.port}")


if __name__ == "__main__":
    main()
