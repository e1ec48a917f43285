#!/usr/bin/env python3
"""Generate tests/fixtures/ggml_quants_golden.bin: golden data for lowbit's ggml (de)quantization tests.

The fixture is a GGUF v3 file (written by the Python `gguf` package, so it also cross-checks lowbit's GGUF
reader against an independent writer). It is named .bin because the repository ignores *.gguf.
Tensors, for each type T:

  dequant.<T>.blocks   raw blocks of type T: random bytes with sane fp16/fp32 scales, plus (for the 32-element
                       formats) blocks that gguf quantized from Gaussian data
  dequant.<T>.values   F32, what gguf.quants.dequantize() returns for those blocks (lowbit must match bit for bit)
  quantize.<T>.input   F32 input rows (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 only)
  quantize.<T>.blocks  gguf.quants.quantize(input) (ggml's reference rounding; lowbit must match byte for byte)

When the SmolLM2 model is in the cache (~/.cache/lowbit or $LOWBIT_CACHE), a few of its rows are stored too:

  smollm2.<tensor>.row<r>.blocks / .values   raw bytes of row r and gguf's dequantization of them
  key smollm2.<tensor>.offset                absolute file offset of the tensor, as gguf.GGUFReader reports it
  keys smollm2.version, smollm2.tensor_count, smollm2.kv_count

Usage: python3 tools/make_quant_golden.py [output path]. Deterministic for a given gguf/numpy version.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

SEED = 20240607
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "fixtures" / "ggml_quants_golden.bin"

# Byte offsets of the fp16 scale fields inside one block (see the block structs in src/io/ggml_quants.cpp).
# Random bytes there could be inf/NaN, which would make the comparison meaningless, so they are overwritten.
F16_SCALE_OFFSETS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}
LEGACY = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
K_QUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
SMOLLM2_ROWS = {  # tensor -> rows to store; covers Q8_0, Q4_1 with two row lengths, and F32
    "token_embd.weight": [0, 49151],
    "blk.0.attn_q.weight": [0, 575],
    "blk.29.ffn_down.weight": [0, 575],
    "blk.0.attn_norm.weight": [0],
}


def sane_scales(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """Finite, normal scales of either sign with magnitudes from 2^-14 to 1."""
    mag = np.exp2(rng.uniform(-14.0, 0.0, size=n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(dtype)


def random_blocks(rng: np.random.Generator, qtype: Q, n_blocks: int) -> np.ndarray:
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qtype == Q.Q8_K:
        blocks[:, 0:4] = sane_scales(rng, n_blocks, np.float32).view(np.uint8).reshape(n_blocks, 4)
    else:
        for off in F16_SCALE_OFFSETS[qtype]:
            blocks[:, off:off + 2] = sane_scales(rng, n_blocks, np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks


def gaussian_rows(rng: np.random.Generator, n_blocks: int, block: int) -> np.ndarray:
    """Gaussian data with a different scale per block, plus edge cases: all zero, constant, one outlier,
    negative extreme, tiny values."""
    x = rng.standard_normal((n_blocks, block)).astype(np.float32)
    x *= np.exp2(rng.uniform(-8.0, 4.0, size=(n_blocks, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = 0.375
    x[2, 7] = 1000.0
    x[3, 3] = -x[3].max() * 3
    x[4] *= np.float32(1e-6)
    return x.reshape(-1)


def dequantize_reference(blocks: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.Q8_K:
        # gguf has no Q8_K dequantizer; the format is just fp32 d times int8 (bsums are unused).
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    return quants.dequantize(blocks, qtype).reshape(-1).astype(np.float32)


def add_float_types(w: gguf.GGUFWriter, rng: np.random.Generator) -> None:
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 6.1035156e-05, 5.9604645e-08, -2.0e-7,
                         1.0e-30, 3.0e38], dtype=np.float64)
    normal = rng.standard_normal(501) * np.exp2(rng.uniform(-20, 20, size=501))
    values = np.concatenate([specials, normal])  # 512 values

    f32 = values.astype(np.float32)
    w.add_tensor("dequant.F32.blocks", f32)
    w.add_tensor("dequant.F32.values", f32)

    with np.errstate(over="ignore"):  # 3e38 is meant to overflow to inf
        f16 = values.astype(np.float16)
    w.add_tensor("dequant.F16.blocks", f16)
    w.add_tensor("dequant.F16.values", f16.astype(np.float32))

    # BF16: arbitrary bit patterns (every exponent, NaN payloads included) plus the rounded values.
    bits = np.concatenate([rng.integers(0, 1 << 16, size=256, dtype=np.uint16),
                           quants.quantize(f32[:256], Q.BF16).view(np.uint16)])
    w.add_tensor("dequant.BF16.blocks", bits.view(np.uint8), raw_dtype=Q.BF16)
    w.add_tensor("dequant.BF16.values", quants.dequantize(bits.view(np.uint8), Q.BF16).astype(np.float32))

    # F64: values that need rounding, overflow to inf and underflow to zero when narrowed to fp32.
    f64 = np.concatenate([values[:500], [1e300, -1e300, 1e-300, 1.0 + 2.0**-30, 1.0 + 2.0**-24, 1.0 + 3 * 2.0**-24,
                                         np.pi, -np.e, 2.0**-149, 2.0**-150, 3 * 2.0**-151, 0.1]])
    w.add_tensor("dequant.F64.blocks", f64.astype(np.float64))
    with np.errstate(over="ignore"):  # numpy narrows with round-to-nearest-even, overflowing to inf
        w.add_tensor("dequant.F64.values", f64.astype(np.float32))


def add_quant_types(w: gguf.GGUFWriter, rng: np.random.Generator) -> None:
    for qtype in LEGACY:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        x = gaussian_rows(rng, 16, block)
        q = quants.quantize(x, qtype).reshape(16, -1)
        w.add_tensor(f"quantize.{qtype.name}.input", x)
        w.add_tensor(f"quantize.{qtype.name}.blocks", q.reshape(-1), raw_dtype=qtype)

        blocks = np.concatenate([q, random_blocks(rng, qtype, 16)])
        w.add_tensor(f"dequant.{qtype.name}.blocks", blocks.reshape(-1), raw_dtype=qtype)
        w.add_tensor(f"dequant.{qtype.name}.values", dequantize_reference(blocks, qtype))
    for qtype in K_QUANTS + [Q.Q8_K]:
        blocks = random_blocks(rng, qtype, 4)
        w.add_tensor(f"dequant.{qtype.name}.blocks", blocks.reshape(-1), raw_dtype=qtype)
        w.add_tensor(f"dequant.{qtype.name}.values", dequantize_reference(blocks, qtype))


def smollm2_path() -> Path | None:
    cache = os.environ.get("LOWBIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lowbit")
    p = Path(cache) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.exists() else None


def add_smollm2_rows(w: gguf.GGUFWriter, path: Path) -> None:
    r = gguf.GGUFReader(path)
    version = r.fields["GGUF.version"]
    w.add_uint32("smollm2.version", int(version.parts[version.data[0]][0]))
    w.add_uint64("smollm2.tensor_count", len(r.tensors))
    w.add_uint64("smollm2.kv_count", len(r.fields) - 3)  # minus the GGUF.* pseudo-fields for the header
    by_name = {t.name: t for t in r.tensors}
    for name, rows in SMOLLM2_ROWS.items():
        t = by_name[name]
        w.add_uint64(f"smollm2.{name}.offset", int(t.data_offset))
        data = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
        for row in rows:
            raw = np.ascontiguousarray(data[row]).view(np.uint8)
            values = (quants.dequantize(raw, t.tensor_type) if t.tensor_type != Q.F32 else raw.view(np.float32))
            w.add_tensor(f"smollm2.{name}.row{row}.blocks", raw, raw_dtype=t.tensor_type)
            w.add_tensor(f"smollm2.{name}.row{row}.values", np.asarray(values, dtype=np.float32).reshape(-1))


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(out, arch="lowbit-golden")
    w.add_string("golden.generator", "tools/make_quant_golden.py")
    w.add_string("golden.numpy_version", np.__version__)
    add_float_types(w, rng)
    add_quant_types(w, rng)
    model = smollm2_path()
    if model is not None:
        add_smollm2_rows(w, model)
    else:
        print("note: SmolLM2 GGUF not found; the real-file rows are left out", file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
