#!/usr/bin/env python3
"""Golden loss and gradients from PyTorch autograd (the trusted implementation) for lowbit's backward pass.

Writes tests/fixtures/grad_golden.safetensors. For each case (a model and a fixed token sequence) transformers
computes, in fp32 on CPU, `loss` for labels = input_ids (mean cross-entropy of token t predicting t+1) and its
gradient with respect to every parameter; a selection of those gradients is stored:

  stories260K   (real trained model, llama2.c checkpoint converted by `lowbit convert`; tied head, GQA 8/4)
                every gradient of layer 0 and all norms in full; every 2-D tensor of the last layer and the
                embedding at a sample of rows.
  tiny_qwen2    (tests/fixtures/tiny_qwen2: q/k/v biases, tied head)
  tiny_mistral_sw (tests/fixtures/tiny_mistral_sw: sliding window 6 over 48 tokens)
  tiny_llama3   (tests/fixtures/tiny_llama3: untied lm_head, llama3 RoPE scaling)
                the tiny models: every norm and bias in full, every 2-D tensor at a sample of rows.

Keys: "<case>/ids" int32 [T], "<case>/loss" f32 [1], "<case>/grad/<name>" f32 [rows, cols] (or [n] for 1-D),
"<case>/rows/<name>" int32 row indices of a sampled 2-D gradient (absent when stored in full).
Metadata "cases": JSON {case: model location}, "shared:<rel>" (the shared data dir) or "fixture:<rel>".

Usage: python tools/make_grad_golden.py [--lowbit build/lowbit] [--shared ../shared]
(needs torch, transformers, safetensors; the lowbit CLI converts stories260K.bin to a Hugging Face directory)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
         "friend Tom. One day, they found a big red ball under a tree. Lily said, \"Let's share the ball!\" Tom "
         "smiled and they played together until the sun went down.")


def gradients(model_dir, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.train(False)
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, labels=x)
    out.loss.backward()
    grads = {n: p.grad.detach().numpy().astype(np.float32) for n, p in model.named_parameters()}
    return float(out.loss.item()), grads


def select(case, loss, ids, grads, full_layers, sampled_layers, sample_rows, rng):
    """Tensors for one case: 1-D gradients and those of full_layers in full; 2-D gradients of sampled_layers and
    outside the layers (embedding, head) at sample_rows rows; the rest is left out."""
    out = {f"{case}/ids": np.array(ids, dtype=np.int32), f"{case}/loss": np.array([loss], dtype=np.float32)}
    for name, g in sorted(grads.items()):
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if g.ndim == 1 or layer in full_layers:
            out[f"{case}/grad/{name}"] = g
            continue
        if layer is not None and layer not in sampled_layers:
            continue
        if name == "model.embed_tokens.weight":   # rows the sequence looks up (and the head) and head-only rows
            used = sorted(set(ids))[: max(1, sample_rows // 2)]
            rest = [r for r in range(g.shape[0]) if r not in set(used)]
            rows = sorted(used + [int(r) for r in rng.choice(rest, size=sample_rows - len(used), replace=False)])
        else:
            rows = sorted(int(r) for r in rng.choice(g.shape[0], size=min(sample_rows, g.shape[0]), replace=False))
        rows = np.array(rows, dtype=np.int32)
        out[f"{case}/grad/{name}"] = np.ascontiguousarray(g[rows])
        out[f"{case}/rows/{name}"] = rows
    print(f"{case}: T={len(ids)} loss={loss:.6f} tensors={sum(k.startswith(case + '/grad/') for k in out)}",
          file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lowbit", default=os.path.join(ROOT, "build", "lowbit"), help="the lowbit CLI")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"), help="the shared data directory")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "grad_golden.safetensors"))
    args = ap.parse_args()
    torch.manual_seed(0)
    rng = np.random.RandomState(2024)
    tensors, cases = {}, {}

    stories = os.path.join(args.shared, "models", "stories260K")
    with tempfile.TemporaryDirectory() as hf_dir:
        subprocess.run([args.lowbit, "convert", os.path.join(stories, "stories260K.bin"), hf_dir, "--force",
                        "--tokenizer", os.path.join(stories, "tok512.bin")], check=True)
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(hf_dir)(STORY)["input_ids"][:64]
        loss, grads = gradients(hf_dir, ids)
    tensors.update(select("stories260K", loss, ids, grads, full_layers=[0], sampled_layers=[4], sample_rows=24, rng=rng))
    cases["stories260K"] = "shared:models/stories260K/stories260K.bin"

    for name in ("tiny_qwen2", "tiny_mistral_sw", "tiny_llama3"):
        d = os.path.join(ROOT, "tests", "fixtures", name)
        config = json.load(open(os.path.join(d, "config.json")))
        ids = [int(x) for x in rng.randint(0, config["vocab_size"], size=48)]
        loss, grads = gradients(d, ids)
        tensors.update(select(name, loss, ids, grads, full_layers=[],
                              sampled_layers=list(range(config["num_hidden_layers"])), sample_rows=8, rng=rng))
        cases[name] = f"fixture:{name}"

    meta = {"cases": json.dumps(cases), "source": f"torch {torch.__version__}, transformers "
            f"{__import__('transformers').__version__}, fp32 autograd, eager attention"}
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(tensors)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
