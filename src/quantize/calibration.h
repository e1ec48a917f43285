// Calibration set: random token windows of seqlen tokens drawn reproducibly (seeded) from a text: jsonl records
// (C4) joined with "\n\n", or a plain file, tokenized once; windows start at uniform random offsets. Models without a
// tokenizer get uniform random token ids instead.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lowbit {

struct CalibOptions {
  std::string file;              // plain text or .jsonl; default: the C4 sample in ../shared/data when present
  std::string jsonl_field = "text";
  int samples = 128;             // GPTQ / QUIK: 128 x 2048; any-precision: 100 x 512
  int seqlen = 2048;
  uint64_t seed = 0;
};

// The default calibration file (shared/data/c4/...calib-docs-0-511.jsonl next to the checkout), or "" when absent.
std::string default_calibration_file();
// Refuses evaluation text (WikiText test, TinyStories valid sample) as calibration data.
std::vector<std::vector<int32_t>> draw_calibration(const Tokenizer& tok, const CalibOptions& opts);
// For a model without a tokenizer (synthetic "random:" sources): opts.samples windows of opts.seqlen token ids drawn
// independently and uniformly from [0, vocab_size), reproducibly from opts.seed (the same on every platform);
// opts.file is not read. Real text's statistics are absent, so this times calibration rather than calibrating well.
std::vector<std::vector<int32_t>> draw_random_calibration(int vocab_size, const CalibOptions& opts);

}  // namespace lowbit
