#!/usr/bin/env python3
"""WikiText-2 perplexity of the SmolLM2 GGUF computed by Hugging Face transformers, the cross-check for `lowbit ppl`.

Same protocol as lowbit and the GPTQ/SqueezeLLM/QUIK evaluation scripts: rows of wiki.test.raw (blank rows as "")
joined with "\\n\\n", tokenized once, nsamples = numel // ctx non-overlapping windows, each scored from a fresh
context, ppl = exp(mean NLL over the ctx - 1 predicted tokens of every window). transformers dequantizes the GGUF
itself. Its GGUF loader lacks llama.cpp's "smollm" pre-tokenizer, so the Digits split of SmolLM2's own
tokenizer.json is restored (see tools/make_tokenizer_golden.py).

With --lowbit FILE (+ --hf-dir for the tokenizer), evaluates a .lowbit file: dense tensors as stored, uniform
weights decoded with numpy from the documented bit layout (tools/check_lowbit_file.py) — an implementation
independent of lowbit's C++ decoder, used to cross-check `lowbit ppl` and to evaluate quickly on a GPU.

With --hf-dir, reads a Hugging Face directory instead (e.g. `lowbit convert` output, whose tokenizer.json is
lowbit's own), and runs on the GPU when one is present.

Usage: python tools/hf_ppl.py [--gguf PATH | --hf-dir DIR] [--text wiki.test.raw] [--ctx 2048] [--max-windows N]
"""
import argparse
import math
import os
import time

import torch


class QuikLinear(torch.nn.Module):
    """QUIK's run-time arithmetic (formats/quik/layout.h) in fp64 on the device: per-token activation quantization
    (integers with halfRange, or FP8-E4M3), the integer GEMM as an fp64 matmul of integer values (exact), the
    zero-point correction through wReduced, and the fp16 outlier columns. abits/fp8 may override the file's."""

    def __init__(self, parts, shape, params, abits=None, fp8=None):
        super().__init__()
        import numpy as np
        from check_lowbit_file import quik_codes, quik_decode
        quik_decode(parts, shape, params)   # checks wReduced and the padding
        n, k = shape
        idx = parts["outlier_idx"].astype(np.int64)
        self.k, self.n = k, n
        self.register_buffer("idx", torch.from_numpy(idx))
        self.register_buffer("base", torch.from_numpy(np.setdiff1d(np.arange(k), idx)))
        codes = torch.from_numpy(quik_codes(parts, shape, params)).double()
        sw = torch.from_numpy(parts["scale"].astype(np.float32))
        self.register_buffer("wq", codes)
        self.register_buffer("wdeq", (sw[:, None] * codes.float()).double())   # fp32(sw) * code, exact
        self.register_buffer("sw", sw.double())
        self.register_buffer("wred", torch.from_numpy(parts["wreduced"].astype(np.float32)).double())
        self.register_buffer("wout", torch.from_numpy(parts["outlier_w"].astype(np.float32).reshape(n, -1)).double())
        self.abits = params["abits"] if abits is None else abits
        self.fp8 = bool(params["act_fp8"]) if fp8 is None else fp8

    @staticmethod
    def e4m3(v):
        a = v.abs()
        _, e = torch.frexp(a)
        qe = torch.clamp(e - 4, min=-9).to(v.dtype)
        r = torch.clamp(torch.round(a * torch.pow(2.0, -qe)) * torch.pow(2.0, qe), max=448.0)
        return torch.where(a == 0, v, torch.copysign(r, v))

    def forward(self, x):
        shape = x.shape
        xs = x.reshape(-1, self.k).float()
        xb = xs[:, self.base]
        y = xs[:, self.idx].half().float().double() @ self.wout.T
        if self.abits == 16:
            y = xb.double() @ self.wdeq.T + y
        elif self.fp8:
            sa = xb.abs().amax(1) / 448.0
            sa = torch.where(sa > 0, sa, torch.ones_like(sa))
            x8 = self.e4m3(xb / sa[:, None]) * 512.0
            y = (sa.double()[:, None] * self.sw[None, :]) * (x8.double() @ self.wq.T) / 512.0 + y
        else:
            L, H = 2 ** self.abits - 1, 2 ** (self.abits - 1)
            mn, mx = xb.amin(1), xb.amax(1)
            sa = (mx - mn) / L
            sa = torch.where(sa > 0, sa, torch.ones_like(sa))
            q = torch.clamp(torch.round((xb - mn[:, None]) / sa[:, None]), 0, L) - H
            acc = q.double() @ self.wq.T
            y = (sa.double()[:, None] * self.sw[None, :]) * acc + (H * sa.double() + mn.double())[:, None] * self.wred[None, :] + y
        return y.float().reshape(*shape[:-1], self.n)


def int8_tables(lut):
    """The GPU int8 GEMV's centroids (src/cuda/int8_tables.h, the same float32 operations): each row's fp16 LUT
    rounded to int8 under the row scale sigma = max|c| / 127, returned as sigma * q."""
    import numpy as np
    c = lut.astype(np.float32)
    s = (np.abs(c).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    q = np.where(s > 0, np.rint(c / np.where(s > 0, s, np.float32(1))), np.float32(0)).astype(np.float32)
    return (s * q).astype(np.float32)


def load_lowbit(path, bits=None, abits=None, fp8=None, i8=False):
    """A transformers model holding exactly the weights a .lowbit file encodes (any-precision: the b-bit view;
    quik: its linears replaced by QuikLinear, activations quantized at abits / fp8 or the file's own). i8: the
    any-precision LUTs of widths 2..4 as the GPU's int8 GEMV uses them (int8_tables), in every layer."""
    import json
    import sys as _sys
    import tempfile

    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    _sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from check_lowbit_file import anyprec_decode, mixed24_decode, mixed24a_decode, quik_decode, uniform_decode

    with safe_open(path, framework="pt") as f:
        meta = json.loads(f.metadata()["lowbit"])
        state, quik = {}, {}
        for name, entry in meta["tensors"].items():
            if entry["format"] == "dense":
                state[name] = f.get_tensor(name).float()
            elif entry["format"] == "uniform":
                parts = {p: f.get_tensor(t).numpy() for p, t in entry["parts"].items()}
                state[name] = torch.from_numpy(uniform_decode(parts, entry["shape"], entry["params"]))
            elif entry["format"] == "mixed24":
                parts = {p: f.get_tensor(t).numpy() for p, t in entry["parts"].items()}
                state[name] = torch.from_numpy(mixed24_decode(parts, entry["shape"], entry["params"]))
            elif entry["format"] == "quik":
                parts = {p: f.get_tensor(t).numpy() for p, t in entry["parts"].items()}
                state[name] = torch.from_numpy(quik_decode(parts, entry["shape"], entry["params"]))
                quik[name] = QuikLinear(parts, entry["shape"], entry["params"], abits, fp8)
            elif entry["format"] == "mixed24a":
                parts = {p: f.get_tensor(t).numpy() for p, t in entry["parts"].items()}
                state[name] = torch.from_numpy(mixed24a_decode(parts, entry["shape"], entry["params"]))
            elif entry["format"] == "anyprec":
                parts = {p: f.get_tensor(t).numpy() for p, t in entry["parts"].items()}
                b = entry["params"]["planes"] if bits is None else bits
                if i8 and b <= 4:
                    n = entry["shape"][0]
                    parts[f"lut{b}"] = int8_tables(parts[f"lut{b}"].reshape(n, 1 << b))
                state[name] = torch.from_numpy(anyprec_decode(parts, entry["shape"], entry["params"], bits))
            else:
                raise SystemExit(f"{path}: format {entry['format']} not supported by this harness")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as cf:
            json.dump(meta["config"], cf)
        config = AutoConfig.from_pretrained(d)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"{path}: missing {missing} unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    for name, module in quik.items():
        parent, attr = name[: -len(".weight")].rsplit(".", 1)
        setattr(model.get_submodule(parent), attr, module)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/lowbit/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                   "wikitext-2-raw", "wiki.test.raw"))
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--hf-dir", default="")
    ap.add_argument("--lowbit", default="")
    ap.add_argument("--bits", default="", help="any-precision .lowbit: width(s) to evaluate, e.g. 3,4,8")
    ap.add_argument("--int8-tables", action="store_true",
                    help="any-precision .lowbit: widths 2..4 with the centroids the GPU's int8 GEMV uses (each row's LUT "
                         "rounded to int8 under a row scale), in every layer; a what-if for models whose layers the "
                         "GPU path does not reach (it needs k >= 2048)")
    ap.add_argument("--abits", default="", help="quik .lowbit: activation variants to evaluate, e.g. 16,8,4,fp8 "
                                                "(default: the file's own)")
    args = ap.parse_args()
    widths = [int(b) for b in args.bits.split(",")] if args.bits else [None]
    if args.abits:
        widths = [("fp8" if a == "fp8" else int(a)) for a in args.abits.split(",")]
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.lowbit:
        tok = AutoTokenizer.from_pretrained(args.hf_dir)
        model = None
    elif args.hf_dir:
        tok = AutoTokenizer.from_pretrained(args.hf_dir)
        model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval().to(dev)
    else:
        d, f = os.path.split(os.path.abspath(args.gguf))
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval().to(dev)
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False   # fp32 all the way, like lowbit's CPU path
        torch.backends.cudnn.allow_tf32 = False
    raw = open(args.text, "rb").read().decode("utf-8")
    text = "\n\n".join(line if line.strip() else "" for line in raw.splitlines(keepends=True))
    ids = torch.tensor(tok(text)["input_ids"])
    n = ids.numel() // args.ctx
    if args.max_windows:
        n = min(n, args.max_windows)
    for bits in widths:
        if args.lowbit and args.abits:
            model = load_lowbit(args.lowbit, None, 8 if bits == "fp8" else bits, bits == "fp8").eval().to(dev)
        elif args.lowbit:
            model = load_lowbit(args.lowbit, bits, i8=args.int8_tables).eval().to(dev)
        nll, count, t0 = 0.0, 0, time.time()
        with torch.no_grad():
            for w in range(n):
                x = ids[w * args.ctx:(w + 1) * args.ctx].unsqueeze(0).to(dev)
                logits = model(x).logits[0, :-1].float()
                nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
                count += args.ctx - 1
        label = ("abits " if args.abits else "bits ") + str(bits) + " " if bits else ""
        if args.int8_tables:
            label += "int8-tables "
        print(f"{label}tokens {ids.numel()} windows {n} predicted {count} "
              f"mean_nll {nll / count:.6f} ppl {math.exp(nll / count):.4f} seconds {time.time() - t0:.1f} "
              f"torch {torch.__version__} threads {torch.get_num_threads()} device {dev}", flush=True)


if __name__ == "__main__":
    main()
