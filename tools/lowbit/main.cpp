// lowbit: the command-line front end of the public API (include/lowbit/lowbit.h).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "commands.h"

namespace lowbit::cli {

void apply_threads(const Common& common) {
  if (common.threads > 0) api::set_cpu_threads(common.threads);
}

void add_device_option(CLI::App* sub, std::string& device) {
  sub->add_option("--device", device, "auto (the GPU when one is present and runs this model), cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
}

api::Device parse_device(const std::string& device) {
  if (device == "cpu") return api::Device::Cpu;
  if (device == "cuda") return api::Device::Cuda;
  return api::Device::Auto;
}

void progress_line(const std::string& label, int done, int total, const std::string& extra) {
  static int last_decile = -1;
  const bool tty = isatty(STDERR_FILENO) != 0;
  const int width = 30;
  const int filled = total > 0 ? done * width / total : width;
  const int decile = total > 0 ? done * 10 / total : 10;
  if (!tty && decile == last_decile && done != total) return;
  last_decile = decile;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "%s%s [%s] %d/%d %s%s", tty ? "\r" : "", label.c_str(), bar.c_str(), done, total,
               extra.c_str(), tty ? "\033[K" : "\n");
  if (tty && done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

namespace {
std::string number(double v) {   // integers exactly ("1048576", not "1.04858e+06"), others as %g
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}
// The value as a finite double, or false.
bool parse_number(const std::string& s, double* v) {
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return !s.empty() && end != nullptr && *end == '\0' && std::isfinite(*v);
}
}  // namespace

CLI::Validator at_least(double lo, const std::string& note) {
  const std::string bound = "must be >= " + number(lo) + (note.empty() ? "" : " (" + note + ")");
  return CLI::Validator(
      [bound, lo](std::string& s) {
        double v = 0;
        return parse_number(s, &v) && v >= lo ? std::string() : bound + ", got " + s;
      },
      ">= " + number(lo));
}

CLI::Validator in_range(double lo, double hi, const std::string& note) {
  const std::string bound = "must be in [" + number(lo) + ", " + number(hi) + "]" + (note.empty() ? "" : " (" + note + ")");
  return CLI::Validator(
      [bound, lo, hi](std::string& s) {
        double v = 0;
        return parse_number(s, &v) && v >= lo && v <= hi ? std::string() : bound + ", got " + s;
      },
      "in [" + number(lo) + ", " + number(hi) + "]");
}

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& s) {
        const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        return digits ? std::string() : "must be an integer >= 0, got " + s;
      },
      "integer >= 0");
}

bool given(const CLI::App* sub, const char* name) { return sub->get_option(name)->count() > 0; }

void refuse_unless(const CLI::App* sub, std::initializer_list<const char*> names, bool applies, const std::string& why) {
  if (applies) return;
  for (const char* name : names)
    if (given(sub, name)) fail(name, " ", why);
}

}  // namespace lowbit::cli

int main(int argc, char** argv) {
  CLI::App app{"lowbit — low-bit LLM engine (any-precision, 2/4/16 mixed, QUIK) with a CPU reference backend"};
  app.require_subcommand(1);
  lowbit::cli::Common common;
  app.add_option("-t,--threads", common.threads, "CPU threads (default: all cores)")
      ->check(lowbit::cli::at_least(0, "0 = all cores"));
  lowbit::cli::register_ppl(app, common);
  lowbit::cli::register_generate(app, common);
  lowbit::cli::register_inspect(app, common);
  lowbit::cli::register_convert(app, common);
  lowbit::cli::register_bench(app, common);
  lowbit::cli::register_quantize(app, common);
  lowbit::cli::register_serve(app, common);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);   // --help
    std::cout.flush();
    std::fprintf(stderr, "lowbit: error: %s (--help lists the options)\n", e.what());
    return e.get_exit_code();
  } catch (const lowbit::Error& e) {
    std::cout.flush();
    std::fprintf(stderr, "lowbit: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "lowbit: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lowbit: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
