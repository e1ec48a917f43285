#!/usr/bin/env python3
"""Writes a Hugging Face model directory of random fp16 weights for a named Llama shape.

    python3 tools/make_random_hf_model.py --shape llama2-7b --out /tmp/llama2-7b-random
    python3 tools/make_random_hf_model.py --shape tiny --out /tmp/tiny-random

The directory holds what `lowbit` (and transformers) read from a real checkpoint:
  config.json                       LlamaForCausalLM, torch_dtype float16
  model-0000i-of-0000n.safetensors  the tensors in fp16, in shards of at most --max-shard-bytes (default 4 GB)
  model.safetensors.index.json      the weight map
  tokenizer.json                    a byte-level BPE (GPT-2 pre-tokenizer) of exactly vocab_size tokens: <unk>, <s>,
  tokenizer_config.json             </s>, the 256 bytes, then merges of byte pairs; it encodes any text and
                                    decodes every id, so `lowbit ppl --text` and `lowbit generate` run on the model
                                    (the numbers mean nothing: the weights are random).

What it is for: measuring what loading a model of a real size costs (host memory, load time, decode speed) without
downloading one: e.g. the host RSS of the CUDA backend loading a 7B-shaped fp16 file
(`lowbit bench /tmp/llama2-7b-random`, or the load_stats() of runtime/backend.h).

Only numpy, json and struct: no torch, no safetensors package. Tensors are generated and written one at a time in
slices of --chunk-elems elements, so the script never holds more than one slice in memory whatever the model size.
Weights are normal with std 1/sqrt(k) for linears (so activations keep their scale through the layers), std 1 for
the embedding, norms 1.0.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# name: (dim, layers, heads, kv_heads, hidden, vocab, max_positions, rope_theta, rms_eps, tie_embeddings)
SHAPES = {
    "tiny": (64, 2, 4, 2, 172, 512, 256, 10000.0, 1e-5, False),
    "llama2-7b": (4096, 32, 32, 32, 11008, 32000, 4096, 10000.0, 1e-5, False),
    "llama2-13b": (5120, 40, 40, 40, 13824, 32000, 4096, 10000.0, 1e-5, False),
    "llama3-8b": (4096, 32, 32, 8, 14336, 128256, 8192, 500000.0, 1e-5, False),
}


def tensor_list(shape):
    """[(name, shape, std)] in the order Hugging Face checkpoints list them; std 0 means all ones (norms)."""
    dim, layers, heads, kv_heads, hidden, vocab = shape[:6]
    hd = dim // heads
    out = [("model.embed_tokens.weight", (vocab, dim), 1.0)]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        out += [
            (p + "input_layernorm.weight", (dim,), 0.0),
            (p + "self_attn.q_proj.weight", (heads * hd, dim), dim ** -0.5),
            (p + "self_attn.k_proj.weight", (kv_heads * hd, dim), dim ** -0.5),
            (p + "self_attn.v_proj.weight", (kv_heads * hd, dim), dim ** -0.5),
            (p + "self_attn.o_proj.weight", (dim, heads * hd), (heads * hd) ** -0.5),
            (p + "post_attention_layernorm.weight", (dim,), 0.0),
            (p + "mlp.gate_proj.weight", (hidden, dim), dim ** -0.5),
            (p + "mlp.up_proj.weight", (hidden, dim), dim ** -0.5),
            (p + "mlp.down_proj.weight", (dim, hidden), hidden ** -0.5),
        ]
    out.append(("model.norm.weight", (dim,), 0.0))
    if not shape[9]:
        out.append(("lm_head.weight", (vocab, dim), dim ** -0.5))
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def plan_shards(tensors, max_bytes):
    """Consecutive tensors grouped into shards of at most max_bytes of data (a larger tensor gets a shard alone)."""
    shards, cur, cur_bytes = [], [], 0
    for t in tensors:
        b = numel(t[1]) * 2
        if cur and cur_bytes + b > max_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += b
    if cur:
        shards.append(cur)
    return shards


def write_shard(path, tensors, rng, chunk_elems):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in tensors:
        nbytes = numel(shape) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)   # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, std in tensors:
            left = numel(shape)
            while left > 0:
                n = min(left, chunk_elems)
                if std == 0.0:
                    block = np.ones(n, dtype="<f2")
                else:
                    block = (rng.standard_normal(n, dtype=np.float32) * np.float32(std)).astype("<f2")
                block.tofile(f)
                left -= n
    return offset


def bytes_to_unicode():
    """GPT-2's map from the 256 byte values to printable characters (what byte-level BPE vocabularies spell)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(out, vocab_size):
    """A byte-level BPE of exactly vocab_size ids: 3 special tokens, 256 bytes, then merges of two bytes each."""
    specials = ["<unk>", "<s>", "</s>"]
    assert vocab_size >= len(specials) + 256, "vocab_size must be at least 259 for the byte-level tokenizer"
    byte_char = bytes_to_unicode()
    vocab = {}
    for i, s in enumerate(specials):
        vocab[s] = i
    for b in range(256):
        vocab[byte_char[b]] = len(specials) + b
    # Byte pairs, printable ASCII first (so common text merges), each pair one new token.
    order = list(range(32, 127)) + [b for b in range(256) if not 32 <= b < 127]
    merges = []
    for a in order:
        for b in order:
            if len(vocab) >= vocab_size:
                break
            piece = byte_char[a] + byte_char[b]
            vocab[piece] = len(vocab)
            merges.append([byte_char[a], byte_char[b]])
        if len(vocab) >= vocab_size:
            break
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True}
            for i, s in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                   "model_max_length": 1 << 30, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, help="directory to write (created; existing files are replaced)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-bytes", type=int, default=4 * 10**9, help="largest shard (default 4 GB)")
    ap.add_argument("--chunk-elems", type=int, default=1 << 24, help="elements generated at a time (memory bound)")
    args = ap.parse_args()

    shape = SHAPES[args.shape]
    dim, layers, heads, kv_heads, hidden, vocab, max_pos, theta, eps, tie = shape
    os.makedirs(args.out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rope_theta": theta,
        "rms_norm_eps": eps,
        "tie_word_embeddings": tie,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
        "_name_or_path": f"random-{args.shape}",
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    tensors = tensor_list(shape)
    shards = plan_shards(tensors, args.max_shard_bytes)
    rng = np.random.default_rng(args.seed)
    weight_map, total = {}, 0
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(args.out, fname), group, rng, args.chunk_elems)
        for name, _, _ in group:
            weight_map[name] = fname
        print(f"{fname}: {len(group)} tensors", file=sys.stderr)
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    write_tokenizer(args.out, vocab)
    params = sum(numel(t[1]) for t in tensors)
    print(f"{args.out}: {args.shape}, {params / 1e6:.1f} M parameters, {total / 1e6:.1f} MB of fp16 in "
          f"{len(shards)} shard(s), tokenizer of {vocab} tokens")


if __name__ == "__main__":
    main()
