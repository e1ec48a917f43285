#!/usr/bin/env python3
"""WikiText-2 perplexity of the SmolLM2 GGUF computed by Hugging Face transformers, the cross-check for `lowbit ppl`.

Same protocol as lowbit and the GPTQ/SqueezeLLM/QUIK evaluation scripts: rows of wiki.test.raw (blank rows as "")
joined with "\\n\\n", tokenized once, nsamples = numel // ctx non-overlapping windows, each scored from a fresh
context, ppl = exp(mean NLL over the ctx - 1 predicted tokens of every window). transformers dequantizes the GGUF
itself. Its GGUF loader lacks llama.cpp's "smollm" pre-tokenizer, so the Digits split of SmolLM2's own
tokenizer.json is restored (see tools/make_tokenizer_golden.py).

Usage: python tools/hf_ppl.py [--gguf PATH] [--text wiki.test.raw] [--ctx 2048] [--max-windows N]
"""
import argparse
import math
import os
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/lowbit/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                   "wikitext-2-raw", "wiki.test.raw"))
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-windows", type=int, default=0)
    args = ap.parse_args()
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    raw = open(args.text, "rb").read().decode("utf-8")
    text = "\n\n".join(line if line.strip() else "" for line in raw.splitlines(keepends=True))
    ids = torch.tensor(tok(text)["input_ids"])
    n = ids.numel() // args.ctx
    if args.max_windows:
        n = min(n, args.max_windows)
    nll, count, t0 = 0.0, 0, time.time()
    with torch.no_grad():
        for w in range(n):
            x = ids[w * args.ctx:(w + 1) * args.ctx].unsqueeze(0)
            logits = model(x).logits[0, :-1].float()
            nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += args.ctx - 1
    print(f"tokens {ids.numel()} windows {n} predicted {count} mean_nll {nll / count:.6f} "
          f"ppl {math.exp(nll / count):.4f} seconds {time.time() - t0:.1f} torch {torch.__version__} threads "
          f"{torch.get_num_threads()}")


if __name__ == "__main__":
    main()
