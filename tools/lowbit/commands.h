// lowbit CLI: one file per subcommand. Each register_* adds its subcommand and options to the app and sets
// a callback; main() turns lowbit::Error into a one-line message and a non-zero exit.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "model/model.h"

namespace lowbit::cli {

struct Common {
  int threads = 0;            // 0 = all cores
  std::string tokenizer;      // llama2.c tokenizer.bin override
};

void register_ppl(CLI::App& app, Common& common);
void register_generate(CLI::App& app, Common& common);
void register_inspect(CLI::App& app, Common& common);
void register_convert(CLI::App& app, Common& common);
void register_bench(CLI::App& app, Common& common);
void register_quantize(CLI::App& app, Common& common);

void apply_threads(const Common& common);
// --device auto|cuda|cpu; use_cuda() resolves it for a loaded model (auto: the GPU when present, unless the model
// holds QUIK weights or cpu_only) and refuses "cuda" when it cannot be honoured.
void add_device_option(CLI::App* sub, std::string& device);
bool use_cuda(const std::string& device, const Model& model, bool cpu_only = false);
std::string device_description();   // "cuda: NVIDIA H200 (...)"
// Progress line on stderr: redrawn in place on a terminal, every ~10% otherwise.
void progress_line(const std::string& label, int done, int total, const std::string& extra);

}  // namespace lowbit::cli
