#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "core/error.h"

namespace lowbit::cli {

void apply_threads(const Common& common) {
  if (common.threads > 0) {
    omp_set_num_threads(common.threads);
    openblas_set_num_threads(common.threads);
  }
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

}  // namespace lowbit::cli

int main(int argc, char** argv) {
  CLI::App app{"lowbit — low-bit LLM engine (any-precision, 2/4/16 mixed, QUIK) with a CPU reference backend"};
  app.require_subcommand(1);
  lowbit::cli::Common common;
  app.add_option("-t,--threads", common.threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
  lowbit::cli::register_ppl(app, common);
  lowbit::cli::register_generate(app, common);
  lowbit::cli::register_inspect(app, common);
  lowbit::cli::register_convert(app, common);
  lowbit::cli::register_bench(app, common);
  lowbit::cli::register_quantize(app, common);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
