// lowbit CLI: one file per subcommand, each a thin layer over the public API (include/lowbit/). Each register_*
// adds its subcommand and options to the app and sets a callback; main() turns lowbit::Error into a one-line
// message and a non-zero exit.
#pragma once
#include <CLI/CLI.hpp>
#include <initializer_list>
#include <sstream>
#include <string>

#include "lowbit/lowbit.h"

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
void register_serve(CLI::App& app, Common& common);

void apply_threads(const Common& common);
// --device auto|cuda|cpu (see lowbit::api::Device).
void add_device_option(CLI::App* sub, std::string& device);
api::Device parse_device(const std::string& device);
// Progress line on stderr: redrawn in place on a terminal, every ~10% otherwise.
void progress_line(const std::string& label, int done, int total, const std::string& extra);

// A value check whose message states the bound plainly (CLI11's own range checks print float bounds in hundreds of
// digits): "--max-windows: must be >= 0 (0 = all), got -3".
CLI::Validator at_least(double lo, const std::string& note = "");
CLI::Validator in_range(double lo, double hi, const std::string& note = "");
// An unsigned integer: refuses a leading '-' (CLI11 would wrap "-1" to 2^64 - 1).
CLI::Validator non_negative_integer();
// Refuses each of `names` the user gave unless `applies`: "lowbit: error: <name> <why>". Options that do not apply
// to what was asked are refused, never ignored.
void refuse_unless(const CLI::App* sub, std::initializer_list<const char*> names, bool applies, const std::string& why);
bool given(const CLI::App* sub, const char* name);   // the user passed the option

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw lowbit::Error(os.str());
}

}  // namespace lowbit::cli
