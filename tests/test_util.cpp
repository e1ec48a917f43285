#include "test_util.h"

#include "core/knobs.h"
#include "model/model.h"
#include "runtime/eval_text.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

namespace lowbit::test {

// The checkout the tests were built from, or $LOWBIT_SOURCE_DIR (test binaries run on another machine, e.g. the
// lent GPU machine, next to a copy of the repository).
std::string source_dir() {
  if (knob_is_set(Knob::SourceDir)) return knob_string(Knob::SourceDir);
  return LOWBIT_SOURCE_DIR;
}
std::string fixture(const std::string& name) { return source_dir() + "/tests/fixtures/" + name; }

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The shared data directory sits beside the checkout (../shared); a clone made elsewhere (CI) finds it through
// $LOWBIT_SHARED_DIR or the workplace's fixed location.
std::string shared_path(const std::string& rel) {
  std::vector<std::string> bases;
  if (knob_is_set(Knob::SharedDir)) bases.push_back(knob_string(Knob::SharedDir));
  bases.push_back(source_dir() + "/../shared");
  bases.push_back("/work/shared");
  for (const std::string& base : bases) {
    const std::string p = base + "/" + rel;
    if (file_exists(p)) return p;
  }
  return std::string();
}

std::string smollm2_gguf() {
  std::string cache;
  if (knob_is_set(Knob::Cache)) cache = knob_string(Knob::Cache);
  else if (const char* home = std::getenv("HOME")) cache = std::string(home) + "/.cache/lowbit";
  std::string p = cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  return file_exists(p) ? p : std::string();
}

std::string tinystories_sample() { return shared_path("data/tinystories/TinyStoriesV2-GPT4-valid.sample8.txt"); }

std::vector<std::vector<int32_t>> tinystories_docs(const Model& m) {
  const EvalText et = load_eval_text(tinystories_sample(), TextMode::Documents, "text", "<|endoftext|>");
  std::vector<std::vector<int32_t>> docs;
  for (const auto& d : et.docs) docs.push_back(m.tokenizer().encode(d, true, false));
  return docs;
}

std::vector<float> cpu_logits_perturbed(const Model& m, const std::vector<int32_t>& ids, double rel, uint32_t seed) {
  const int n = static_cast<int>(ids.size()), dim = m.config().dim;
  std::vector<float> x(static_cast<size_t>(n) * dim), logits(static_cast<size_t>(n) * m.config().vocab_size);
  m.embed(ids.data(), n, x.data());
  std::mt19937 rng(seed);
  for (float& v : x) v = static_cast<float>(v * (1.0 + ((rng() & 1u) ? rel : -rel)));
  KVCache cache = m.new_cache(n);
  for (int l = 0; l < m.config().n_layers; ++l) m.layer_forward(l, x.data(), n, 0, cache, nullptr);
  m.head_forward(x.data(), n, logits.data());
  return logits;
}

std::string temp_dir() {
  // Every directory handed out is removed when the test binary exits (quantized SmolLM2 files are 150+ MB each).
  struct Registry {
    std::vector<std::filesystem::path> dirs;
    ~Registry() {
      for (const auto& d : dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    }
  };
  static Registry registry;
  static std::mt19937_64 rng(std::random_device{}());
  auto p = std::filesystem::temp_directory_path() / ("lowbit-test-" + std::to_string(rng()));
  std::filesystem::create_directories(p);
  registry.dirs.push_back(p);
  return p.string();
}

void expect_cli_refuses(const std::vector<std::pair<std::string, std::string>>& cases, const std::string& must_not_exist) {
  std::string out;
  for (const auto& [args, phrase] : cases) {
    EXPECT_NE(run_cli(args, &out), 0) << args;
    EXPECT_NE(out.find(phrase), std::string::npos) << args << "\n" << out;
  }
  if (!must_not_exist.empty()) {
    EXPECT_FALSE(file_exists(must_not_exist)) << must_not_exist;
  }
}

int run_cli(const std::string& args, std::string* output) {
  std::string cmd = std::string(LOWBIT_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  std::string out;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = ::pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void fuzz_file(const std::string& valid, const std::string& path,
                              const std::function<bool(const std::string&)>& open_and_read,
                              const std::function<void(std::string&, std::mt19937&)>& corrupt, int random_mutants) {
  int opened = 0, rejected = 0;
  auto trial = [&](const std::string& bytes) {
    std::filesystem::remove(path);  // recreating is much cheaper than truncating in place on some filesystems
    write_file(path, bytes);
    (open_and_read(path) ? opened : rejected)++;
  };
  for (size_t len = 0; len < valid.size(); ++len) trial(valid.substr(0, len));
  for (size_t pos = 0; pos < valid.size(); ++pos) {
    for (uint8_t mask : {0x01, 0x80, 0xFF}) {
      std::string m = valid;
      m[pos] = static_cast<char>(m[pos] ^ mask);
      trial(m);
    }
  }
  std::mt19937 rng(42);
  for (int i = 0; i < random_mutants; ++i) {
    std::string m = valid;
    corrupt(m, rng);
    trial(m);
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(opened, 0);
  std::printf("[          ] %d mutants opened, %d rejected with lowbit::Error\n", opened, rejected);
}

}  // namespace lowbit::test
