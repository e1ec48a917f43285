#include "quantize/calibration.h"

#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/knobs.h"
#include "runtime/eval_text.h"

namespace lowbit {

std::string default_calibration_file() {
  const char* rel = "data/c4/c4-validation.calib-docs-0-511.jsonl";
  std::vector<std::string> bases;
  if (knob_is_set(Knob::SharedDir)) bases.push_back(knob_string(Knob::SharedDir));
  bases.push_back("../shared");
  bases.push_back("/work/shared");
  for (const auto& b : bases) {
    std::error_code ec;
    const std::string p = b + "/" + rel;
    if (std::filesystem::is_regular_file(p, ec)) return p;
  }
  return "";
}

std::vector<std::vector<int32_t>> draw_calibration(const Tokenizer& tok, const CalibOptions& opts) {
  const std::string file = opts.file.empty() ? default_calibration_file() : opts.file;
  LOWBIT_CHECK(!file.empty(), "no calibration text: pass --calib FILE (the default C4 sample was not found)");
  const std::string name = std::filesystem::path(file).filename().string();
  LOWBIT_CHECK(name.find("wiki") == std::string::npos && name.find("valid.sample") == std::string::npos &&
                   name.find(".test.") == std::string::npos,
               file, ": looks like evaluation text; calibrating on it would inflate every reported perplexity");
  LOWBIT_CHECK(opts.samples > 0 && opts.seqlen >= 2, "--calib-samples must be > 0 and --calib-seqlen >= 2");
  // The documents joined with "\n\n" (jsonl records, or the plain file) form one token stream; windows start at
  // uniform random offsets. GPTQ's get_c4 instead picks documents longer than seqlen, which a 512-document sample
  // has too few of at seqlen 2048 (windows would repeat).
  const EvalText text = load_eval_text(file, TextMode::Auto, opts.jsonl_field, "");
  const std::vector<int32_t> stream = tok.encode(text.docs[0], /*add_bos=*/false, /*parse_special=*/false);
  LOWBIT_CHECK(stream.size() > static_cast<size_t>(opts.seqlen), file, ": only ", stream.size(),
               " tokens, fewer than --calib-seqlen ", opts.seqlen);
  std::mt19937_64 rng(opts.seed);
  std::uniform_int_distribution<size_t> start_dist(0, stream.size() - static_cast<size_t>(opts.seqlen));
  std::vector<std::vector<int32_t>> out;
  out.reserve(static_cast<size_t>(opts.samples));
  for (int s = 0; s < opts.samples; ++s) {
    const size_t start = start_dist(rng);
    out.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(start),
                     stream.begin() + static_cast<std::ptrdiff_t>(start) + opts.seqlen);
  }
  return out;
}

std::vector<std::vector<int32_t>> draw_random_calibration(int vocab_size, const CalibOptions& opts) {
  LOWBIT_CHECK(vocab_size > 0, "random calibration needs a positive vocab_size, got ", vocab_size);
  LOWBIT_CHECK(opts.samples > 0 && opts.seqlen >= 2, "--calib-samples must be > 0 and --calib-seqlen >= 2");
  // mt19937_64's sequence is fixed by the standard; the multiply-shift reduction (rather than
  // uniform_int_distribution, whose algorithm is the library's choice) keeps the ids the same everywhere.
  std::mt19937_64 rng(opts.seed);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(opts.samples));
  for (auto& window : out) {
    window.resize(static_cast<size_t>(opts.seqlen));
    for (int32_t& id : window)
      id = static_cast<int32_t>((static_cast<unsigned __int128>(rng()) * static_cast<uint64_t>(vocab_size)) >> 64);
  }
  return out;
}

}  // namespace lowbit
