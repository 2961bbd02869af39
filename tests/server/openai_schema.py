#!/usr/bin/env python3
"""Validates what `slm serve` answers against the JSON schemas of OpenAI's published OpenAPI spec.

Usage: openai_schema.py SLM_BINARY SOURCE_DIR
The schemas are tests/server/data/openai_schema.json (an excerpt of the spec, verbatim; README.md there says from
which commit). Starts `slm serve` on a free port with the tiny recipe (random weights) and checks, with jsonschema:
  /v1/chat/completions  the response against CreateChatCompletionResponse (its message: ChatCompletionResponseMessage),
                        each streamed chunk against CreateChatCompletionStreamResponse;
  /v1/completions       the response and each streamed chunk against CreateCompletionResponse.
Negative controls: the responses as the server sent them before issue 42 (a message without `refusal`,
`system_fingerprint: null`) must fail the same schemas, so the check is shown to see those faults.
Fails (exit 1) naming scripts/test-deps.sh when jsonschema is missing.
"""
import copy
import importlib.metadata
import json
import sys

from slm_serve import SlmServe, require, sse_events, tiny_model_args

jsonschema = require("jsonschema")


def openapi_nullable(node):
    """The spec is OpenAPI 3.1 (JSON Schema 2020-12) but a few of its schemas still say `nullable: true`, OpenAPI 3.0's
    way of allowing null that JSON Schema ignores (the stream chunk's finish_reason, logprobs, usage). Each such schema
    becomes anyOf [itself, null], which is what the keyword means; nothing else is changed."""
    if isinstance(node, list):
        return [openapi_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_nullable(v) for k, v in node.items() if k != "nullable"}
    return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") is True else out


class Schemas:
    def __init__(self, path, patch=None):
        doc = json.load(open(path))
        self.version = doc["info"]["version"]
        self.commit = doc["info"]["source_commit"]
        self.components = openapi_nullable(doc["components"])
        if patch:
            patch(self.components["schemas"])

    def validator(self, name):
        # The excerpt keeps the spec's layout, so "#/components/schemas/..." references resolve against this root.
        root = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"#/components/schemas/{name}",
                "components": self.components}
        cls = jsonschema.Draft202012Validator
        cls.check_schema(root)
        return cls(root, format_checker=cls.FORMAT_CHECKER)

    def errors(self, name, instance):
        return sorted(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                      for e in self.validator(name).iter_errors(instance))

    def check(self, name, instance, what):
        errors = self.errors(name, instance)
        assert not errors, f"{what} does not match {name}:\n  " + "\n  ".join(errors) + f"\n{json.dumps(instance)}"


def streamed_completion_chunk(schemas):
    """CreateCompletionResponse says the legacy endpoint streams chunks of the same shape as its response, but its
    finish_reason (a string) is only known on the last chunk; OpenAI's API sends null on the others, as its chat chunk
    schema allows (`nullable: true` there). Only for the chunks before the last: null allowed there as well."""
    fr = schemas["CreateCompletionResponse"]["properties"]["choices"]["items"]["properties"]["finish_reason"]
    schemas["CreateCompletionResponse"]["properties"]["choices"]["items"]["properties"]["finish_reason"] = {
        "anyOf": [fr, {"type": "null"}]}


def expect_rejected(schemas, name, instance, fragment, what):
    errors = schemas.errors(name, instance)
    assert any(fragment in e for e in errors), f"negative control: {what} was not rejected by {name} " \
                                               f"(expected an error with {fragment!r}, got {errors})"


def main():
    slm, src = sys.argv[1], sys.argv[2]
    path = f"{src}/tests/server/data/openai_schema.json"
    spec = Schemas(path)
    chunk_spec = Schemas(path, streamed_completion_chunk)
    messages = [{"role": "user", "content": "Write a loop in C++."}]
    with SlmServe(slm, tiny_model_args(src)) as server:
        def post(path, body):
            status, _, raw = server.post(path, body)
            assert status == 200, (path, status, raw)
            return raw

        chat = json.loads(post("/v1/chat/completions",
                               {"model": "auto", "messages": messages, "max_tokens": 8, "temperature": 0}))
        spec.check("CreateChatCompletionResponse", chat, "a chat completion")
        spec.check("ChatCompletionResponseMessage", chat["choices"][0]["message"], "its message")
        assert "refusal" in chat["choices"][0]["message"] and "system_fingerprint" not in chat, chat

        chunks = sse_events(post("/v1/chat/completions", {
            "model": "auto", "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}))
        assert len(chunks) >= 3, chunks  # text, the finish and the usage
        for i, c in enumerate(chunks):
            spec.check("CreateChatCompletionStreamResponse", c, f"chat chunk {i}")
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == \
            chat["choices"][0]["message"]["content"]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == chat["usage"], chunks[-1]

        completion = json.loads(post("/v1/completions",
                                     {"model": "tiny-hybrid", "prompt": "int main() {", "max_tokens": 6, "seed": 3}))
        spec.check("CreateCompletionResponse", completion, "a completion")

        chunks = sse_events(post("/v1/completions", {
            "model": "tiny-hybrid", "prompt": "int main() {", "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}))
        finished = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
        assert len(finished) == 1, chunks
        spec.check("CreateCompletionResponse", finished[0], "the last completion chunk")  # unrelaxed
        for i, c in enumerate(chunks):
            chunk_spec.check("CreateCompletionResponse", c, f"completion chunk {i}")

    # Negative controls: the server's answers as they were before (message without refusal, system_fingerprint null).
    old = copy.deepcopy(chat)
    del old["choices"][0]["message"]["refusal"]
    expect_rejected(spec, "CreateChatCompletionResponse", old, "'refusal' is a required property",
                    "a chat message without refusal")
    for name, good in (("CreateChatCompletionResponse", chat), ("CreateCompletionResponse", completion),
                       ("CreateChatCompletionStreamResponse", None)):
        old = copy.deepcopy(good) if good else {"id": "x", "object": "chat.completion.chunk", "created": 1,
                                                 "model": "m", "choices": []}
        old["system_fingerprint"] = None
        expect_rejected(spec, name, old, "system_fingerprint: None is not of type 'string'",
                        f"system_fingerprint null in {name}")
    # The relaxed chunk schema still rejects what the spec does not allow elsewhere.
    bad = copy.deepcopy(completion)
    bad["choices"][0]["finish_reason"] = "eos"
    expect_rejected(chunk_spec, "CreateCompletionResponse", bad, "'eos' is not valid", "finish_reason eos")
    print(f"OK: slm serve's chat and completion responses and stream chunks match OpenAI's OpenAPI spec "
          f"{spec.version} (openai/openai-openapi {spec.commit[:12]}), checked by jsonschema "
          f"{importlib.metadata.version('jsonschema')}")


if __name__ == "__main__":
    main()
