#!/usr/bin/env python3
"""Writes openai_schema.json: the response objects of OpenAI's published OpenAPI spec that `slm serve` sends.

Usage: extract_openai_schema.py OPENAPI_JSON COMMIT > openai_schema.json
OPENAPI_JSON is openapi.json of the repository openai/openai-openapi at COMMIT. The excerpt keeps the spec's own
layout (components.schemas.NAME), so its "$ref"s resolve unchanged; only the schemas the roots reach are kept, and
each is copied verbatim. README.md beside this file says which commit the committed excerpt came from.
"""
import json
import sys

ROOTS = ["CreateChatCompletionResponse", "CreateChatCompletionStreamResponse", "CreateCompletionResponse"]
PREFIX = "#/components/schemas/"


def refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def main():
    spec = json.load(open(sys.argv[1]))
    schemas = spec["components"]["schemas"]
    keep, todo = {}, list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = schemas[name]
        for r in refs(schemas[name]):
            assert r.startswith(PREFIX), r
            todo.append(r[len(PREFIX):])
    out = {
        "$comment": f"An excerpt of OpenAI's OpenAPI spec {spec['info']['version']} (OpenAPI {spec['openapi']}): "
                    f"openapi.json of github.com/openai/openai-openapi at commit {sys.argv[2]}, the schemas "
                    f"{', '.join(ROOTS)} and those they reference, verbatim (tests/server/data/README.md).",
        "info": {"title": spec["info"]["title"], "version": spec["info"]["version"], "source_commit": sys.argv[2]},
        "components": {"schemas": dict(sorted(keep.items()))},
    }
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
