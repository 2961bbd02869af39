#!/usr/bin/env python3
"""Drives `slm serve` with the official `openai` Python client, unmodified, on loopback.

Usage: openai_client.py SLM_BINARY SOURCE_DIR
Starts `slm serve` on a free port with the tiny recipe (random weights) and checks chat, completions, streaming,
the models list, a completion with a suffix (fill in the middle) and an error. Fails (exit 1) naming scripts/test-deps.sh when the openai package is missing.
"""
import json
import sys
import urllib.request

from slm_serve import SlmServe, require, tiny_model_args

openai = require("openai")


def main():
    slm, src = sys.argv[1], sys.argv[2]
    with SlmServe(slm, tiny_model_args(src)) as server:
        port = server.port
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120)

        models = [m.id for m in client.models.list()]
        assert models == ["tiny-hybrid", "auto"], models

        chat = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Write a loop in C++."}], max_tokens=8,
            temperature=0)
        assert chat.choices[0].message.role == "assistant"
        assert chat.choices[0].message.refusal is None
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

        # Fill in the middle: prompt before the cursor, suffix after (the legacy API's `suffix`). The prompt the server
        # builds is SPM order (docs/serving.md): <|bos|> <|fim_prefix|> <|fim_suffix|> suffix <|fim_middle|> prompt,
        # so its length is the two texts' token counts (from /tokenize) plus four control tokens.
        fill = client.completions.create(model="tiny-hybrid", prompt="int main() {\n  return ", suffix=";\n}\n",
                                         max_tokens=4, temperature=0)
        assert isinstance(fill.choices[0].text, str) and fill.choices[0].finish_reason in ("stop", "length")

        def n_tokens(text):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=json.dumps({"content": text}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                return len(json.load(r)["tokens"])

        expected = 4 + n_tokens(";\n}\n") + n_tokens("int main() {\n  return ")
        assert fill.usage.prompt_tokens == expected, (fill.usage.prompt_tokens, expected)

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


if __name__ == "__main__":
    main()
