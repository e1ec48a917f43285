#!/usr/bin/env python3
"""The empirical Fisher diagonal of every linear weight from PyTorch autograd: the trusted implementation that
fisher_diagonal() (src/model/backward.h) and fisher_diagonal_gpu() (src/backend_cuda/quantize/fisher_gpu.h) are
checked against.

    F[W] = sum over windows s of (dLoss_s / dW)^2

Loss_s is the `loss` transformers returns for input_ids = labels = window s (mean cross-entropy of token t
predicting token t+1), computed in fp32 with eager attention; W runs over q/k/v/o_proj and gate/up/down_proj of
every layer (the embedding, head, norms and biases are left out, as in lowbit).

Two commands:

  fixture   writes tests/fixtures/fisher_golden.safetensors for tests/test_fisher_gpu.cpp:
              stories260K      real trained model (llama2.c checkpoint converted by `lowbit convert`, or --stories-hf),
                               tied head, GQA 8/4, RoPE rows permuted from llama2.c's order; 3 windows of real
                               tokens of different lengths; every linear of layer 0 in full, the last layer's at a
                               sample of rows
              tiny_qwen2       q/k/v biases, tied head          (tests/fixtures/tiny_qwen2)
              tiny_mistral_sw  sliding window 6 < window length (tests/fixtures/tiny_mistral_sw)
              tiny_llama3      untied head, llama3 RoPE scaling (tests/fixtures/tiny_llama3)
                               3 random windows each, every linear in full
            Keys: "<case>/window/<i>" int32 [T_i], "<case>/mean_loss" f64 [1], "<case>/fisher/<name>" f32 [rows, k],
            "<case>/rows/<name>" int32 row indices when only those rows are stored. Metadata "cases": JSON
            {case: "shared:<rel>" | "fixture:<rel>"}, the model's location for the C++ test.

  compute   any model transformers loads (a Hugging Face directory; convert .gguf / llama2.c first with
            `lowbit convert`), windows from a JSON file (a list of token-id lists); writes "<name>" f32 [n, k] for
            every linear (or those of --layers) and "mean_loss" f64 [1]. Runs on --device cuda where there is one:
              python tools/fisher_ref.py compute --model /tmp/llama2-7b --windows w.json --out f.safetensors \\
                  --device cuda --layers 0,31

Needs torch, transformers, safetensors, numpy.
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
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
         "friend Tom. One day, they found a big red ball under a tree. Lily said, \"Let's share the ball!\" Tom "
         "smiled and they played together until the sun went down. The next morning, Lily woke up early and ran to "
         "the window. The sky was blue and the birds were singing.")


def load_model(model_dir, device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.train(False)
    return model.to(device)


def linear_names(model, layers=None):
    n_layers = model.config.num_hidden_layers
    chosen = range(n_layers) if layers is None else layers
    return [f"model.layers.{l}.{s}.weight" for l in chosen for s in LINEARS]


def fisher(model, windows, names, device):
    """Sum over windows of squared gradients of the named weights (fp32, accumulated in window order as lowbit
    does), and the mean of the windows' losses."""
    params = dict(model.named_parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    for n in names:
        params[n].requires_grad_(True)
    acc = {n: torch.zeros_like(params[n]) for n in names}
    losses = []
    for ids in windows:
        x = torch.tensor([ids], dtype=torch.long, device=device)
        for n in names:
            params[n].grad = None
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        for n in names:
            acc[n] += params[n].grad * params[n].grad
        losses.append(float(out.loss.item()))
    return {n: a.detach().cpu().numpy().astype(np.float32) for n, a in acc.items()}, float(np.mean(losses))


def case_tensors(case, windows, mean_loss, diag, sampled, sample_rows, rng):
    """Fixture keys of one case: windows, mean loss, and each diagonal in full or (names in `sampled`) at
    sample_rows random rows."""
    out = {f"{case}/mean_loss": np.array([mean_loss], dtype=np.float64)}
    for i, w in enumerate(windows):
        out[f"{case}/window/{i}"] = np.array(w, dtype=np.int32)
    for name, d in sorted(diag.items()):
        if name in sampled:
            rows = np.array(sorted(rng.choice(d.shape[0], size=min(sample_rows, d.shape[0]), replace=False)),
                            dtype=np.int32)
            out[f"{case}/fisher/{name}"] = np.ascontiguousarray(d[rows])
            out[f"{case}/rows/{name}"] = rows
        else:
            out[f"{case}/fisher/{name}"] = d
    print(f"{case}: windows {[len(w) for w in windows]} mean loss {mean_loss:.6f} tensors {len(diag)}",
          file=sys.stderr)
    return out


def cmd_fixture(args):
    torch.manual_seed(0)
    rng = np.random.RandomState(2025)
    tensors, cases = {}, {}

    def stories_case(hf_dir):
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(hf_dir)(STORY)["input_ids"]
        # Three windows of different lengths, overlapping, all real text.
        windows = [ids[0:48], ids[10:74], ids[30:63]]
        assert all(len(w) >= 2 for w in windows), [len(w) for w in windows]
        model = load_model(hf_dir, "cpu")
        last = model.config.num_hidden_layers - 1
        names = linear_names(model, [0, last])
        diag, mean_loss = fisher(model, windows, names, "cpu")
        sampled = set(linear_names(model, [last]))
        return case_tensors("stories260K", windows, mean_loss, diag, sampled, 24, rng)

    if args.stories_hf:
        tensors.update(stories_case(args.stories_hf))
    else:
        stories = os.path.join(args.shared, "models", "stories260K")
        with tempfile.TemporaryDirectory() as hf_dir:
            subprocess.run([args.lowbit, "convert", os.path.join(stories, "stories260K.bin"), hf_dir, "--force",
                            "--tokenizer", os.path.join(stories, "tok512.bin")], check=True)
            tensors.update(stories_case(hf_dir))
    cases["stories260K"] = "shared:models/stories260K/stories260K.bin"

    for name, lengths in (("tiny_qwen2", (24, 17, 9)), ("tiny_mistral_sw", (30, 13, 7)), ("tiny_llama3", (20, 32, 5))):
        d = os.path.join(ROOT, "tests", "fixtures", name)
        config = json.load(open(os.path.join(d, "config.json")))
        windows = [[int(x) for x in rng.randint(0, config["vocab_size"], size=n)] for n in lengths]
        model = load_model(d, "cpu")
        diag, mean_loss = fisher(model, windows, linear_names(model), "cpu")
        tensors.update(case_tensors(name, windows, mean_loss, diag, set(), 0, rng))
        cases[name] = f"fixture:{name}"

    meta = {"cases": json.dumps(cases), "source": f"torch {torch.__version__}, transformers "
            f"{__import__('transformers').__version__}, fp32 autograd, eager attention, tools/fisher_ref.py"}
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(tensors)} tensors", file=sys.stderr)


def cmd_compute(args):
    windows = json.load(open(args.windows))
    model = load_model(args.model, args.device)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    diag, mean_loss = fisher(model, windows, linear_names(model, layers), args.device)
    out = dict(diag)
    out["mean_loss"] = np.array([mean_loss], dtype=np.float64)
    save_file(out, args.out, metadata={"windows": str(len(windows)), "source": f"torch {torch.__version__}"})
    print(f"wrote {args.out}: {len(diag)} tensors, mean loss {mean_loss:.6f}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture", help="write tests/fixtures/fisher_golden.safetensors")
    fx.add_argument("--lowbit", default=os.path.join(ROOT, "build", "lowbit"),
                    help="the lowbit CLI (converts stories260K)")
    fx.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"), help="the shared data directory")
    fx.add_argument("--stories-hf", help="stories260K already converted to a Hugging Face directory (no CLI needed)")
    fx.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "fisher_golden.safetensors"))
    fx.set_defaults(run=cmd_fixture)
    cp = sub.add_parser("compute", help="Fisher diagonal of a model over token windows")
    cp.add_argument("--model", required=True, help="Hugging Face model directory")
    cp.add_argument("--windows", required=True, help="JSON list of token-id lists")
    cp.add_argument("--out", required=True)
    cp.add_argument("--device", default="cpu")
    cp.add_argument("--layers", help="comma-separated layer indices (default: all)")
    cp.set_defaults(run=cmd_compute)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
