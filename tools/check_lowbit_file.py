#!/usr/bin/env python3
"""Opens a .lowbit container with the Python `safetensors` package (no lowbit code involved) and checks it
against docs/formats/lowbit-container.md, docs/formats/uniform.md and docs/formats/anyprec.md: the metadata JSON,
every tensor entry and part, no tensor left unreferenced, and the bit accounting. Uniform and any-precision weights
are decoded with numpy from the documented bit layouts; --dump NAME prints one decoded weight's first row.

    python3 tools/check_lowbit_file.py model.lowbit [--dump model.layers.0.self_attn.q_proj.weight]

Needs: safetensors, numpy, torch (safetensors' numpy loader has no bfloat16).
"""
import argparse
import json
import math
import sys

import numpy as np
from safetensors import safe_open

DTYPE_BITS = {"F32": 32, "F16": 16, "BF16": 16, "I32": 32, "I16": 16, "U8": 8}
TORCH_TO_ST = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.int32": "I32", "torch.int16": "I16",
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


def anyprec_slots(k):
    """(word, bit) of every column 0..32W-1 of a plane row (docs/formats/anyprec.md)."""
    W = (k + 31) // 32
    c = np.arange(32 * W)
    tile = c // 1024
    first = tile * 32
    nw = np.minimum(32, W - first)
    o = c - tile * 1024
    u, rest = o // (8 * nw), o % (8 * nw)
    return first + rest // 8, 8 * u + rest % 8


def anyprec_decode(parts, shape, params, bits=None):
    """The b-bit view: w[r][c] = fp32(lut_b[r][top b bits of the parent code]), outliers (CSR) override."""
    n, k = shape
    P = params["planes"]
    b = P if bits is None else bits
    assert (params["widths"] >> b) & 1, f"width {b} not served"
    planes = parts["planes"].astype(np.int64) & 0xFFFFFFFF           # [P, n, W]
    word, bit = anyprec_slots(k)
    cols = (planes[:, :, word] >> bit) & 1                              # [P, n, 32W]: plane j = bit P-1-j
    assert not cols[:, :, k:].any(), "non-zero padding bits"
    codes = np.zeros((n, k), dtype=np.int64)
    for j in range(b):
        codes = (codes << 1) | cols[j, :, :k]
    w = np.take_along_axis(parts[f"lut{b}"].astype(np.float32), codes, axis=1)
    if params["sparse"]:
        rowptr, col, val = parts["outlier_rowptr"], parts["outlier_col"], parts["outlier_val"].astype(np.float32)
        rows = np.repeat(np.arange(n), np.diff(rowptr))
        w[rows, col] = val
    return w


def mixed24_decode(parts, shape, params):
    """2/4-bit groups of 16 columns: w = (q - z) * s, 2-bit scales s = fmaf(code, ss, sm) per 16-row block."""
    n, k = shape
    bits = parts["group_bits"].astype(np.int64)
    G = bits.size
    words = parts["qweight"].astype(np.int64) & 0xFFFFFFFF
    start = np.concatenate([[0], np.cumsum(16 * bits)[:-1]])
    c = np.arange(k)
    g = c // 16
    pos = start[g] + (c % 16) * bits[g]
    codes = (words[:, pos // 32] >> (pos % 32)) & ((1 << bits[g]) - 1)
    assert codes.shape == (n, k)
    is4 = bits == 4
    slot = np.where(is4, np.cumsum(is4) - 1, np.cumsum(~is4) - 1)
    w = np.zeros((n, k), dtype=np.float32)
    def fields(words, count, width):   # per-row little-endian streams of fixed-width fields
        if count == 0:
            return np.zeros((n, 0), dtype=np.int64)
        words = words.astype(np.int64) & 0xFFFFFFFF
        stream = ((words[:, :, None] >> np.arange(32)) & 1).reshape(words.shape[0], -1)
        assert not stream[:, count * width:].any(), "non-zero padding bits"
        return (stream[:, : count * width].reshape(-1, count, width) << np.arange(width)).sum(-1)
    G4 = int(is4.sum())
    sz2 = fields(parts["meta2"], G - G4, 6)
    rows = np.arange(n) // 16
    # ŝ = fmaf(code, ss, sm): exact in float64 (fp16 operands, 4-bit code), then one rounding to float32
    s2 = ((sz2 & 15) * parts["ss2"].astype(np.float64)[rows] + parts["sm2"].astype(np.float64)[rows]).astype(np.float32)
    z2 = (sz2 >> 4).astype(np.float32)
    s4 = parts["scale4"].astype(np.float32)
    z4 = fields(parts["zero4"], G4, 4).astype(np.float32)
    q = codes.astype(np.float32)
    m2 = ~is4[g]
    j = slot[g]
    w[:, m2] = (q[:, m2] - z2[:, j[m2]]) * s2[:, j[m2]]
    w[:, ~m2] = (q[:, ~m2] - z4[:, j[~m2]]) * s4[:, j[~m2]]
    if params["sparse"]:
        rowptr = parts["outlier_rowptr"]
        col = parts["outlier_col"].astype(np.int64) & 0xFFFF
        r = np.repeat(np.arange(n), np.diff(rowptr))
        w[r, col] = parts["outlier_val"].astype(np.float32)
    return w


def mixed24a_decode(parts, shape, params):
    """Aligned 2/4-bit layout: units [2,2,2,4] of permuted 16-column groups; returns W in the original column order."""
    n, k = shape
    U, G = k // 64, k // 16
    qa = parts["qa"].astype(np.int64) & 0xFFFFFFFF            # [n, U, 4]
    qb = parts["qb"].astype(np.int64) & 0xFFFFFFFF            # [n, U]
    i = np.arange(16)
    codes = np.zeros((n, U, 4, 16), dtype=np.int64)
    for s in range(3):
        codes[:, :, s, :] = (qa[:, :, s, None] >> (2 * i)) & 3
    codes[:, :, 3, :8] = (qa[:, :, 3, None] >> (4 * i[:8])) & 15
    codes[:, :, 3, 8:] = (qb[:, :, None] >> (4 * i[:8])) & 15
    m2 = parts["meta2"].astype(np.int64) & 0xFFFF
    m4 = parts["meta4"].astype(np.int64) & 0xFF
    sc = np.stack([m2 & 15, (m2 >> 4) & 7, (m2 >> 7) & 7, m4 & 15], axis=-1)            # [n, U, 4]
    z = np.stack([(m2 >> 10) & 3, (m2 >> 12) & 3, (m2 >> 14) & 3, m4 >> 4], axis=-1)
    rows = np.arange(n) // 16
    ss = np.concatenate([parts["ss2"].astype(np.float64).reshape(-1, U, 3), parts["ss4"].astype(np.float64).reshape(-1, U, 1)], -1)
    sm = np.concatenate([parts["sm2"].astype(np.float64).reshape(-1, U, 3), parts["sm4"].astype(np.float64).reshape(-1, U, 1)], -1)
    # ŝ = fmaf(code, ss, sm): exact in float64 (fp16 operands, <= 4-bit code), then one rounding to float32
    scale = (sc * ss[rows] + sm[rows]).astype(np.float32)
    w_stored = ((codes.astype(np.float32) - z[..., None].astype(np.float32)) * scale[..., None]).reshape(n, k)
    if params["sparse"]:
        rowptr = parts["outlier_rowptr"]
        col = parts["outlier_col"].astype(np.int64) & 0xFFFF
        r = np.repeat(np.arange(n), np.diff(rowptr))
        assert not w_stored[r, col].any(), "dense code under an outlier is not its zero point"
        w_stored[r, col] = parts["outlier_val"].astype(np.float32)
    perm = parts["perm"].astype(np.int64) & 0xFFFF
    assert sorted(perm.tolist()) == list(range(G)), "perm is not a permutation"
    cols = (perm[:, None] * 16 + i).reshape(-1)             # stored column -> original column
    w = np.empty((n, k), dtype=np.float32)
    w[:, cols] = w_stored
    return w


def quik_codes(parts, shape, params):
    """Signed weight codes [n, kb] of a quik weight (base columns in increasing order)."""
    n, k = shape
    kb = k - params["outliers"]
    if params["wbits"] == 8:
        return parts["qweight8"].astype(np.int64).reshape(n, kb)
    b = parts["qweight4"].astype(np.int64).reshape(n, -1) & 0xFF
    nib = np.stack([b & 15, b >> 4], axis=-1).reshape(n, -1)
    assert not nib[:, kb:].any(), "non-zero padding nibble"
    nib = nib[:, :kb]
    return np.where(nib >= 8, nib - 16, nib)


def quik_decode(parts, shape, params):
    """QUIK weight half: base columns fp32(sw) * code, outlier columns fp16; checks wReduced by its definition."""
    n, k = shape
    idx = parts["outlier_idx"].astype(np.int64)
    base = np.setdiff1d(np.arange(k), idx)
    codes = quik_codes(parts, shape, params)
    sw = parts["scale"].astype(np.float32)
    wred = (sw.astype(np.float64) * codes.sum(1)).astype(np.float32)
    assert np.array_equal(wred, parts["wreduced"].astype(np.float32)), "wreduced is not scale * sum of codes"
    w = np.empty((n, k), dtype=np.float32)
    w[:, base] = sw[:, None] * codes.astype(np.float32)
    w[:, idx] = parts["outlier_w"].astype(np.float32).reshape(n, -1)
    return w


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
            assert entry["format"] in ("uniform", "anyprec", "mixed24", "mixed24a", "quik"), f"{name}: unknown format {entry['format']}"
            parts = {}
            for part, stored in entry["parts"].items():
                t = f.get_tensor(stored)
                bits = t.numel() * DTYPE_BITS[TORCH_TO_ST[str(t.dtype)]]
                quantized_bits += bits
                data_bits += bits
                parts[part] = t.numpy()
                used.add(stored)
            n, k = entry["shape"]
            if entry["format"] == "uniform":
                w = uniform_decode(parts, (n, k), entry["params"])
            elif entry["format"] == "mixed24":
                w = mixed24_decode(parts, (n, k), entry["params"])
            elif entry["format"] == "mixed24a":
                w = mixed24a_decode(parts, (n, k), entry["params"])
            elif entry["format"] == "quik":
                w = quik_decode(parts, (n, k), entry["params"])
            else:
                w = anyprec_decode(parts, (n, k), entry["params"])
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
