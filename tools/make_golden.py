#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers (the trusted implementation) for lowbit's model tests.

Writes tests/fixtures/smollm2_golden.safetensors: for each prompt, the token ids HF's tokenizer produced and the
fp32 logits at the last position, computed by transformers on CPU in fp32 from the same GGUF file lowbit reads
(transformers dequantizes the Q4_1 weights itself and un-permutes q/k — an independent path from ours).

Optionally (--stories-hf DIR) also writes tests/fixtures/stories260k_golden.safetensors from a Hugging Face directory
produced by `lowbit convert stories260K.bin DIR`.

Also (--tiny) writes tests/fixtures/tiny_<arch>/: tiny randomly initialised Hugging Face models (Llama with llama3
RoPE scaling in bf16, Qwen2 with q/k/v bias in fp16, Mistral in fp32 sharded across two files) with the logits of
every position for a fixed token sequence, so config-driven features are checked against transformers itself.

Usage: pip install torch transformers gguf safetensors accelerate && python tools/make_golden.py [--gguf PATH] [--tiny]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
    "Robert Boulter is an English film , television and theatre actor . He had a guest @-@ starring role",
    "In 1905, Albert Einstein published four papers. Σ α β γ — naïve café 日本語 🙂 1234567",
]


def run(model, tok_ids):
    with torch.no_grad():
        out = model(torch.tensor([tok_ids], dtype=torch.long))
    return out.logits[0, -1].to(torch.float32).numpy()


def make_tiny(out):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=96, max_position_embeddings=128, rms_norm_eps=1e-5)
    specs = [
        ("llama3", LlamaForCausalLM, LlamaConfig(**common, rope_theta=500000.0, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 16}), torch.bfloat16, None),
        ("qwen2", Qwen2ForCausalLM, Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True),
            torch.float16, None),
        ("mistral", MistralForCausalLM, MistralConfig(**common, rope_theta=10000.0, tie_word_embeddings=False,
            head_dim=16, sliding_window=None), torch.float32, "20KB"),
        ("mistral_sw", MistralForCausalLM, MistralConfig(**common, rope_theta=10000.0, tie_word_embeddings=True,
            sliding_window=6), torch.float32, None),
    ]
    ids = [int(x) for x in np.random.RandomState(7).randint(0, 96, size=40)]
    for name, cls, cfg, dtype, shard in specs:
        torch.manual_seed(1234)
        model = cls(cfg)
        with torch.no_grad():  # random init is tiny; widen weights so the logits are not all ~0
            for p in model.parameters():
                p.mul_(8.0 if p.dim() > 1 else 1.0)
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        model = model.to(dtype).eval()
        d = os.path.join(out, "tiny_" + name)
        os.makedirs(d, exist_ok=True)
        kw = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, safe_serialization=True, **kw)
        # Reload from disk in fp32: casting the in-memory model to bf16 and back would also round the RoPE
        # inv_freq buffer, which a fresh load (and lowbit) computes in fp32.
        fresh = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = fresh(torch.tensor([ids])).logits[0].numpy()
        save_file({"ids": np.array(ids, dtype=np.int32), "logits": logits.astype(np.float32)},
                  os.path.join(d, "golden.safetensors"))
        for junk in ("generation_config.json",):
            if os.path.exists(os.path.join(d, junk)):
                os.remove(os.path.join(d, junk))
        print(f"tiny {name}: {sorted(os.listdir(d))}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/lowbit/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    ap.add_argument("--stories-hf", default="", help="HF dir converted from stories260K.bin by lowbit convert")
    ap.add_argument("--tiny", action="store_true", help="write the tiny random HF model fixtures")
    args = ap.parse_args()
    if args.tiny:
        make_tiny(args.out)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    if args.gguf and os.path.exists(args.gguf):
        d, f = os.path.split(os.path.abspath(args.gguf))
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
        model.eval()
        tensors, meta = {}, {"prompts": json.dumps(PROMPTS), "source": "transformers " + __import__("transformers").__version__}
        for i, p in enumerate(PROMPTS):
            ids = tok(p)["input_ids"]
            tensors[f"ids.{i}"] = np.array(ids, dtype=np.int32)
            tensors[f"logits.{i}"] = run(model, ids).astype(np.float32)
            print(f"prompt {i}: {len(ids)} tokens, argmax {int(tensors[f'logits.{i}'].argmax())}", file=sys.stderr)
        save_file(tensors, os.path.join(args.out, "smollm2_golden.safetensors"), metadata=meta)
    if args.stories_hf:
        model = AutoModelForCausalLM.from_pretrained(args.stories_hf, dtype=torch.float32)
        model.eval()
        tok = AutoTokenizer.from_pretrained(args.stories_hf)
        prompts = ["Once upon a time, there was a little girl named Lily.", "The cat sat on the mat and"]
        tensors = {}
        for i, p in enumerate(prompts):
            ids = tok(p)["input_ids"]
            tensors[f"ids.{i}"] = np.array(ids, dtype=np.int32)
            tensors[f"logits.{i}"] = run(model, ids).astype(np.float32)
        save_file(tensors, os.path.join(args.out, "stories260k_golden.safetensors"), metadata={"prompts": json.dumps(prompts)})


if __name__ == "__main__":
    main()
