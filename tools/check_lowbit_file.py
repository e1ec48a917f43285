#!/usr/bin/env python3
"""Opens a .lowbit container with the Python `safetensors` package (no lowbit code involved) and checks it
against docs/formats/lowbit-container.md and docs/formats/uniform.md: the metadata JSON, every tensor entry and
part, no tensor left unreferenced, and the bit accounting. Uniform weights are decoded with numpy from the
documented bit layout; --dump NAME prints one decoded weight's first row.

    python3 tools/check_lowbit_file.py model.lowbit [--dump model.layers.0.self_attn.q_proj.weight]

Needs: safetensors, numpy, torch (safetensors' numpy loader has no bfloat16).
"""
import argparse
import json
import math
import sys

import numpy as np
from safetensors import safe_open

DTYPE_BITS = {"F32": 32, "F16": 16, "BF16": 16, "I32": 32, "U8": 8}
TORCH_TO_ST = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.int32": "I32",
               "torch.uint8": "U8"}


def uniform_decode(parts, shape, params):
    """w[r][c] = (q[r][c] - z[r][g]) * fp32(s[r][g]), codes a little-endian bit stream per row."""
    n, k = shape
    bits, gs = params["bits"], params["group_size"]
    words = parts["qweight"].astype(np.int64) & 0xFFFFFFFF          # [n, W] int32 bits as uint32
    stream = ((words[:, :, None] >> np.arange(32)) & 1).reshape(n, -1)  # bit i of the row stream
    codes = (stream[:, : k * bits].reshape(n, k, bits) << np.arange(bits)).sum(-1)
    assert not stream[:, k * bits:].any(), "non-zero padding bits"
    g = parts["g_idx"].astype(np.int64) if "g_idx" in parts else np.arange(k) // gs
    scales = parts["scales"].astype(np.float32)[:, g]
    zeros = (parts["zeros"].astype(np.float32)[:, g] if "zeros" in parts
             else np.float32(2 ** (bits - 1)))
    return (codes.astype(np.float32) - zeros) * scales


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--dump", default="")
    args = ap.parse_args()
    with safe_open(args.path, framework="pt") as f:
        meta = json.loads(f.metadata()["lowbit"])
        assert meta["format_version"] == 1, meta["format_version"]
        names = set(f.keys())
        used = set()
        quantized_weights = quantized_bits = params = data_bits = 0
        for name, entry in meta["tensors"].items():
            if entry["format"] == "dense":
                t = f.get_tensor(name)
                assert TORCH_TO_ST[str(t.dtype)] == entry["dtype"], (name, t.dtype)
                used.add(name)
                params += t.numel()
                data_bits += t.numel() * DTYPE_BITS[entry["dtype"]]
                continue
            assert entry["format"] == "uniform", f"{name}: unknown format {entry['format']}"
            parts = {}
            for part, stored in entry["parts"].items():
                t = f.get_tensor(stored)
                bits = t.numel() * DTYPE_BITS[TORCH_TO_ST[str(t.dtype)]]
                quantized_bits += bits
                data_bits += bits
                parts[part] = t.numpy()
                used.add(stored)
            n, k = entry["shape"]
            w = uniform_decode(parts, (n, k), entry["params"])
            quantized_weights += n * k
            params += n * k
            if name == args.dump:
                print(name, "row 0:", w[0].tolist())
        assert used == names, f"unreferenced tensors: {sorted(names - used)}"
        b = meta["bits"]
        assert b["quantized_weights"] == quantized_weights and b["quantized_bits"] == quantized_bits, b
        assert math.isclose(b["file_bits_per_param"], data_bits / params, rel_tol=1e-12), b
        print(f"{args.path}: OK — {len(meta['tensors'])} tensors, {quantized_weights} quantized weights, "
              f"{b['avg_bits_per_weight']:.4f} bits/weight, method {json.dumps(meta['method'])}")


if __name__ == "__main__":
    sys.exit(main())
