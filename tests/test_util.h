// Shared helpers for tests: where the fixtures and the shared data live, and how to skip out loud.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace lowbit {
class Model;
}

namespace lowbit::test {

std::string source_dir();                        // repository root
std::string fixture(const std::string& name);   // tests/fixtures/<name>
// ../shared/<rel> next to the repository (or $LOWBIT_SHARED_DIR/<rel>); "" when absent.
std::string shared_path(const std::string& rel);
// The SmolLM2 GGUF in the model cache ($LOWBIT_CACHE or ~/.cache/lowbit); "" when absent.
std::string smollm2_gguf();
// The TinyStories evaluation sample (8 stories) in ../shared; "" when absent.
std::string tinystories_sample();
// Its stories as documents, each tokenized by m with BOS (stories260K's reference protocol).
std::vector<std::vector<int32_t>> tinystories_docs(const Model& m);
// All-position logits [n, vocab] of ids on the CPU with every embedding value first scaled by 1 ± rel (seeded signs):
// how far the model's own arithmetic moves its output under noise of that size (rel 0: the plain forward).
std::vector<float> cpu_logits_perturbed(const Model& m, const std::vector<int32_t>& ids, double rel, uint32_t seed);
std::string temp_dir();                          // a fresh directory under the system temp dir
// Runs the lowbit CLI with args, capturing stdout+stderr; returns the exit status.
int run_cli(const std::string& args, std::string* output);
bool file_exists(const std::string& path);
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
// Each (args, phrase): the CLI exits non-zero and says phrase; afterwards `must_not_exist` (if not empty) is absent.
void expect_cli_refuses(const std::vector<std::pair<std::string, std::string>>& cases, const std::string& must_not_exist);

// Expects open(path) to throw one single-line lowbit::Error naming the path and containing phrase.
template <typename Open>
void expect_error(Open open, const std::string& path, const std::string& phrase) {
  try {
    open(path);
    ADD_FAILURE() << "no error for " << path << " (expected '" << phrase << "')";
  } catch (const lowbit::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << "expected '" << phrase << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// Expects f() to throw one single-line lowbit::Error containing phrase (a refusal that names no file).
template <typename F>
void expect_refused(F f, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "no error (expected '" << phrase << "')";
  } catch (const lowbit::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(phrase), std::string::npos) << "expected '" << phrase << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// Fuzzing: runs read(path) (open a file, touch all it maps, return a checksum); true when that succeeded, false when it threw a
// single-line lowbit::Error that starts with "<path>: ". Any other exception fails the test.
template <typename Read>
bool opens_or_refuses_cleanly(const std::string& path, Read read) {
  try {
    [[maybe_unused]] volatile auto sink = read(path);   // read returns a checksum; keeping it keeps the reads
    return true;
  } catch (const lowbit::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": non-lowbit exception " << e.what();
    return false;
  }
}

// Fuzz driver: writes every truncation of `valid`, three bit flips at every byte, and `random_mutants` more made by
// corrupt(bytes, rng) to `path`, calling open_and_read(path) on each. Expects some mutants to open and some to be
// rejected (so the mutations reach both paths) and prints the counts.
void fuzz_file(const std::string& valid, const std::string& path,
                              const std::function<bool(const std::string&)>& open_and_read,
                              const std::function<void(std::string&, std::mt19937&)>& corrupt, int random_mutants);

}  // namespace lowbit::test

// Skip with a reason that ctest shows (never a silent return).
#define LOWBIT_REQUIRE_FILE(path, what)                                             \
  do {                                                                              \
    if ((path).empty()) GTEST_SKIP() << "missing " << (what) << " (run scripts/setup.sh)"; \
  } while (0)
