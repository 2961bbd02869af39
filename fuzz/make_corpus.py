#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ (committed; run again only to regenerate them).

The JSON seeds are the repository's own files (recipes, manifests) and the request bodies of docs/serving.md and the
server tests. The binary seeds are small, valid files in each format, built here from the formats' descriptions
(docs/formats.md, the headers of src/slm/io/safetensors.h, router/classifier.h, data/shards.h, data/pack.h) with
the names, dtypes and labels of the shipped models, shrunk to a few hundred bytes so that libFuzzer mutates them
quickly. Checksums the harness fills in itself (router file, shard CRCs) are left as zeros or dropped.
"""
import hashlib
import json
import lzma
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def copy(target, rel):
    put(target, rel.replace("/", "_"), open(os.path.join(ROOT, rel), "rb").read())


def requests():
    chat = lambda **kw: json.dumps({"model": "auto", "messages": [{"role": "user", "content": "Why does find_package(fmt) fail?"}], **kw})
    put("openai_request", "chat_docs.json", chat(max_tokens=32))
    put("openai_request", "chat_all_fields.json", json.dumps({
        "model": "cmake", "messages": [
            {"role": "system", "content": "You answer CMake questions."},
            {"role": "user", "content": [{"type": "text", "text": "How do I add a library"}, {"type": "text", "text": " to a target?"}]},
            {"role": "assistant", "content": None}, {"role": "tool", "content": "ok"}],
        "max_completion_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7, "n": 1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "stop": ["\n\n", "```"],
        "stream": True, "stream_options": {"include_usage": True}, "logprobs": False, "best_of": 1,
        "response_format": {"type": "text"}, "user": "ignored"}))
    put("openai_request", "completion.json", json.dumps({"model": "cpp", "prompt": "int main() {", "max_tokens": 8, "stop": "}"}))
    put("openai_request", "completion_list.json", json.dumps({"model": "auto-2", "prompt": ["#include <vector>\n"], "echo": 0}))
    put("openai_request", "refused_tools.json", chat(tools=[{"type": "function"}]))


def safetensors():
    # An NVFP4 weights file as `slm quantize` writes it (models/*/model.safetensors), one small layer of it.
    tensors = [  # name, dtype, shape, element size
        ("embed.weight.nvfp4.tensor_scale", "F32", [1], 4),
        ("final_norm.weight", "BF16", [4], 2),
        ("embed.weight.nvfp4.codes", "U8", [4, 8], 1),
        ("embed.weight.nvfp4.scales", "U8", [4, 1], 1),
        ("layers.0.attn.q_norm.weight", "BF16", [2], 2),
    ]
    header, off, data = {}, 0, b""
    for name, dtype, shape, size in tensors:
        n = size
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((off + i) % 251 for i in range(n))
        off += n
    header["__metadata__"] = {"format": "slm-weights", "slm.quantized": "nvfp4", "slm.nvfp4": "1",
                              "embed.weight.nvfp4.dtype": "BF16", "embed.weight.nvfp4.shape": "4,16"}
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    put("safetensors", "nvfp4_layer.safetensors", struct.pack("<Q", len(text)) + text.encode() + data)
    empty = '{"__metadata__":{"format":"pt"}}'
    put("safetensors", "empty.safetensors", struct.pack("<Q", len(empty)) + empty.encode())
    i64 = '{"x":{"dtype":"I64","shape":[2,0,3],"data_offsets":[0,0]},"y":{"dtype":"F8_E4M3","shape":[],"data_offsets":[0,1]}}'
    put("safetensors", "zero_dim.safetensors", struct.pack("<Q", len(i64)) + i64.encode() + b"\x38")


def router():
    # models/router.bin's header with 2^4 buckets; the harness appends the checksum, so the seed stops before it.
    labels = ["algorithm", "cmake", "cpp", "debug", "design", "review", "shell"]
    header = json.dumps({"features": {"bucket_bits": 4, "char_max": 5, "char_min": 3, "line_shapes": True,
                                      "max_bytes": 4096, "word_bigrams": True, "word_trigrams": True},
                         "labels": labels}, separators=(",", ":"))
    w = b"".join(struct.pack("<f", ((i * 37) % 17 - 8) / 8.0) for i in range(16 * len(labels)))
    b = b"".join(struct.pack("<f", 0.1 * i) for i in range(len(labels)))
    put("router", "router_v2.bin", b"SLMROUTR" + struct.pack("<II", 2, len(header)) + header.encode() + w + b)
    v1 = json.dumps({"features": {"bucket_bits": 4, "char_max": 0, "char_min": 1, "max_bytes": 64,
                                  "word_bigrams": False}, "labels": ["cpp", "shell"]}, separators=(",", ":"))
    put("router", "router_v1.bin", b"SLMROUTR" + struct.pack("<II", 1, len(v1)) + v1.encode() + bytes(4 * (16 * 2 + 2)))


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def shard_bytes(docs, vocab=512):
    dtype = 2 if vocab <= 65536 else 4
    tokens = [t for d in docs for t in d]
    offsets = [0]
    for d in docs:
        offsets.append(offsets[-1] + len(d))
    body = b"".join(struct.pack("<H" if dtype == 2 else "<I", t) for t in tokens)
    token_end = 64 + len(body)
    offsets_at = (token_end + 7) & ~7
    offsets_bytes = b"".join(struct.pack("<Q", o) for o in offsets)
    header = b"SLMTOKS\0" + struct.pack("<IIII", 1, dtype, vocab, 64) + struct.pack(
        "<QQQ", len(tokens), len(docs), offsets_at) + struct.pack("<III", crc32c(body), crc32c(offsets_bytes), 0)
    header += struct.pack("<I", crc32c(header))
    data = header + body + bytes(offsets_at - token_end) + offsets_bytes
    meta = {"format": "slm-token-shard-meta", "version": 1, "shard": "s.slmtok", "vocab_size": vocab,
            "dtype": "uint16" if dtype == 2 else "uint32", "token_count": len(tokens), "doc_count": len(docs),
            "tokens_crc32c": crc32c(body), "extra": {"tokenizer": "tokenizer/slm-code-512.model"},
            "documents": [{"package": "cmake", "path": f"Modules/Find{i}.cmake", "license": "BSD-3-Clause",
                           "domain": "cmake", "tokens": len(d)} for i, d in enumerate(docs)]}
    return data, json.dumps(meta, indent=1)


def shards():
    data, meta = shard_bytes([[1, 17, 300, 2], [], [1, 5, 2]])
    put("shard", "three_docs.slmtok", data + b"\n--sidecar--\n" + meta.encode())
    data, meta = shard_bytes([[70000, 3]], vocab=100000)
    put("shard", "u32.slmtok", data + b"\n--sidecar--\n" + meta.encode())


def packs():
    data, meta = shard_bytes([[1, 17, 300, 2], [1, 5, 2]])
    members, blobs, off = [], b"", 0
    for name, raw in [("cmake/train-00000.slmtok", data), ("cmake/train-00000.slmtok.json", meta.encode())]:
        xz = lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=0)
        members.append({"name": name, "bytes": len(raw), "packed": len(xz), "offset": off,
                        "sha256": hashlib.sha256(raw).hexdigest()})
        blobs += xz
        off += len(xz)
    h = json.dumps({"format": 1, "kind": "tokens", "members": members, "tokens": 7}, separators=(",", ":"))
    put("pack", "two_members.slmpack", b"SLMPACK1" + struct.pack("<Q", len(h)) + h.encode() + blobs)


def regressions():
    """Inputs that crashed a target before the fix named in each (kept as seeds, so every run tries them again)."""
    tiny = json.load(open(os.path.join(ROOT, "recipes/tiny-hybrid.json")))
    full = json.load(open(os.path.join(ROOT, "recipes/tiny-full.json")))
    edit = lambda r, f: (lambda c: (f(c), json.dumps(c))[1])(json.loads(json.dumps(r)))
    # 1e400: nlohmann throws out_of_range (not parse_error) for a number past double's range; it escaped
    # util/json_reader.cpp, io/safetensors.cpp and server/openai.cpp (an HTTP 500 instead of 400).
    put("openai_request", "regress_number_overflow.json", '{"model": "cpp", "prompt": "x", "max_tokens": 1e400}')
    put("recipe", "regress_number_overflow.json", json.dumps(tiny).replace('"seq_len": 256', '"seq_len": 1e400'))
    put("manifest", "regress_number_overflow.json", '{"name": "x", "specialists": [{"name": "a", "training_tokens": 1e400}]}')
    h = '{"x":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}}'
    put("safetensors", "regress_number_overflow.safetensors", struct.pack("<Q", len(h)) + h.encode() + b"\0")
    # depth 2^31 - 1: make_plan allocated 2 GB for the tiled pattern, then ran out of memory (recipe.cpp: depth bound).
    put("recipe", "regress_depth.json", edit(tiny, lambda c: c.update(depth=2147483647)))
    # Sizes near 2^31: the accounting's products and sums overflowed 64 bits (UB; accounting.cpp: 128-bit products).
    put("recipe", "regress_count_overflow.json", edit(tiny, lambda c: c["moe"].update(
        routed_experts=2147483647, experts_per_token=1, expert_hidden=2147483647)))
    # Engram with 2^31 - 1 heads per order: the next-prime search per table never ended (plan.cpp: table bound).
    put("recipe", "regress_engram_tables.json", edit(full, lambda c: c["engram"].update(heads_per_order=2147483647)))
    put("recipe", "regress_engram_rows.json", edit(full, lambda c: c["engram"].update(table_rows=9223372036854775807)))
    # [0, 2^62, 2^62]: no bytes, but libtorch's strides overflow and torch::empty threw c10::Error (safetensors.cpp).
    h = '{"x":{"dtype":"U8","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]}}'
    put("safetensors", "regress_stride_overflow.safetensors", struct.pack("<Q", len(h)) + h.encode())
    # A float bucket_bits (UB converting 1e30 to uint32) and 2^26 buckets x 200 labels (a 53 GB allocation before
    # the size check) in router files (classifier.cpp).
    feat = {"bucket_bits": 1e30, "char_max": 5, "char_min": 3, "line_shapes": True, "max_bytes": 4096,
            "word_bigrams": True, "word_trigrams": True}
    for name, f, labels in [("regress_float_field.bin", feat, ["a", "b"]),
                            ("regress_huge_alloc.bin", dict(feat, bucket_bits=26), ["l%d" % i for i in range(200)])]:
        hj = json.dumps({"features": f, "labels": labels}, separators=(",", ":")).encode()
        put("router", name, b"SLMROUTR" + struct.pack("<II", 2, len(hj)) + hj)
    # A sidecar whose document fields are not strings: DocumentMeta::from_json's value() threw nlohmann's type_error
    # (shards.cpp).
    data, meta = shard_bytes([[1, 2]])
    meta = json.loads(meta)
    meta["documents"][0]["package"] = 5
    put("shard", "regress_sidecar_types.slmtok", data + b"\n--sidecar--\n" + json.dumps(meta).encode())
    # Pack headers (pack.cpp): "format" a string (nlohmann type_error), sizes that are floats (UB converting 1e300),
    # and a member claiming 100 GB (xz_decompress allocated the claimed size before decoding).
    def pack(h):
        h = json.dumps(h).encode()
        return b"SLMPACK1" + struct.pack("<Q", len(h)) + h
    xz = lzma.compress(b"abc", format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=0)
    put("pack", "regress_format_string.slmpack", pack({"format": "1", "members": []}))
    put("pack", "regress_float_size.slmpack", pack({"format": 1, "tokens": 1e300, "members": [
        {"name": "a", "bytes": 1e300, "packed": 0, "offset": 0, "sha256": ""}]}))
    put("pack", "regress_huge_member.slmpack", pack({"format": 1, "members": [
        {"name": "a", "bytes": 100000000000, "packed": len(xz), "offset": 0, "sha256": ""}]}) + xz)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    requests()
    for rel in ["recipes/tiny-hybrid.json", "recipes/tiny-full.json", "recipes/tiny-ae.json", "recipes/nam56r.json",
                "recipes/specialist-shipped.json"]:
        copy("recipe", rel)
    for rel in ["models/ensemble.json", "recipes/ensembles/product.json", "recipes/ensembles/tiny-serve.json"]:
        copy("manifest", rel)
    safetensors()
    router()
    shards()
    packs()
    regressions()


if __name__ == "__main__":
    main()
