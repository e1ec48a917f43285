// Shared helpers for tests: where the fixtures and the shared data live, and how to skip out loud.
#pragma once
#include <string>

namespace lowbit::test {

std::string source_dir();                        // repository root
std::string fixture(const std::string& name);   // tests/fixtures/<name>
// ../shared/<rel> next to the repository (or $LOWBIT_SHARED_DIR/<rel>); "" when absent.
std::string shared_path(const std::string& rel);
// The SmolLM2 GGUF in the model cache ($LOWBIT_CACHE or ~/.cache/lowbit); "" when absent.
std::string smollm2_gguf();
std::string temp_dir();                          // a fresh directory under the system temp dir
// Runs the lowbit CLI with args, capturing stdout+stderr; returns the exit status.
int run_cli(const std::string& args, std::string* output);
bool file_exists(const std::string& path);
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace lowbit::test

// Skip with a reason that ctest shows (never a silent return).
#define LOWBIT_REQUIRE_FILE(path, what)                                             \
  do {                                                                              \
    if ((path).empty()) GTEST_SKIP() << "missing " << (what) << " (run scripts/setup.sh)"; \
  } while (0)
