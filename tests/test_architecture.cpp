// Checks on the source tree that keep the architecture honest (docs/ARCHITECTURE.md):
//   - every LOWBIT_* environment variable is read through the knob registry (src/core/knobs.h), every registered knob
//     is read somewhere, and docs/KNOBS.md is the registry's own rendering;
//   - no code dispatches on a packed format's name: formats are FormatId values (formats/format_id.h), and the name
//     is parsed only by the .lowbit reader.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "core/knobs.h"
#include "test_util.h"

namespace lowbit {
namespace {

namespace fs = std::filesystem;

struct SourceFile {
  std::string rel;    // path from the repository root
  std::string text;
};

// The code of the product, its benchmarks, tools and tests (not docs/, fixtures or scripts).
std::vector<SourceFile> sources() {
  std::vector<SourceFile> out;
  const fs::path root = test::source_dir();
  for (const char* dir : {"src", "include", "tools", "bench", "tests", "examples"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      if (!e.is_regular_file()) continue;
      const std::string ext = e.path().extension().string();
      if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh") continue;
      if (e.path().string().find("/fixtures/") != std::string::npos) continue;
      out.push_back({fs::relative(e.path(), root).string(), test::read_file(e.path().string())});
    }
  }
  return out;
}

int line_of(const std::string& text, size_t pos) {
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

TEST(Architecture, KnobsDocMatchesRegistry) {
  const std::string doc = test::read_file(test::source_dir() + "/docs/KNOBS.md");
  if (doc != knobs_markdown()) {
    ADD_FAILURE() << "docs/KNOBS.md differs from the registry in src/core/knobs.cpp; regenerate it with "
                     "`build/test_architecture --gtest_also_run_disabled_tests --gtest_filter='*WriteKnobsDoc*'`";
  }
}

TEST(Architecture, DISABLED_WriteKnobsDoc) { test::write_file(test::source_dir() + "/docs/KNOBS.md", knobs_markdown()); }

TEST(Architecture, EnvironmentReadOnlyThroughKnobs) {
  const std::regex direct(R"re(getenv\s*\(\s*"LOWBIT_)re");
  for (const SourceFile& f : sources()) {
    if (f.rel == "src/core/knobs.cpp") continue;
    for (auto it = std::sregex_iterator(f.text.begin(), f.text.end(), direct); it != std::sregex_iterator(); ++it)
      ADD_FAILURE() << f.rel << ":" << line_of(f.text, static_cast<size_t>(it->position()))
                    << ": reads a LOWBIT_* variable directly; declare it in src/core/knobs.cpp and use knob_*()";
  }
}

TEST(Architecture, EveryKnobIsRead) {
  const std::vector<SourceFile> files = sources();
  const std::string names[] = {
      "SharedDir", "Cache", "Int8Tables", "LutStream", "MixedMma", "FusedGemm", "DenseGemv", "QuikFused", "QuikProducerAct", "QuikAttentionAct", "QuikGemvChunk",
      "GroupGemv",
      "FoldSwiglu", "ProducerXmax", "GemvBalance", "I8Pack", "I8Stages", "LutStreamRingX", "FoldRope", "MixedStep",
      "ClusterCombine", "AttnSplits", "TcAttention",
      "Pdl", "PdlMask", "SourceDir", "TokenizerJsonOut", "RssModel", "DemoCalib", "BuildDir"};
  ASSERT_EQ(std::size(names), knob_table().size()) << "list every Knob enumerator here";
  for (size_t i = 0; i < std::size(names); ++i) {
    const std::string& n = names[i];
    const KnobInfo& info = knob_table()[i];
    if (std::string(info.purpose).rfind("scripts/", 0) == 0) {   // a script's variable: that script reads it
      const std::string script = std::string(info.purpose).substr(0, std::string(info.purpose).find(':'));
      EXPECT_NE(test::read_file(test::source_dir() + "/" + script).find(info.name), std::string::npos)
          << info.name << " is registered for " << script << ", which does not read it";
      continue;
    }
    bool used = false;
    for (const SourceFile& f : files)
      if (f.rel != "src/core/knobs.cpp" && f.rel != "src/core/knobs.h" && f.rel != "tests/test_architecture.cpp" &&
          f.rel != "tests/test_kernel_choice.cpp")
        used = used || f.text.find("Knob::" + n + ")") != std::string::npos;
    EXPECT_TRUE(used) << "Knob::" << n << " is registered but no code reads it: remove it from src/core/knobs.cpp";
  }
  // The Cache knob is read by the scripts too (scripts/setup.sh, scripts/demo.sh); the others only by C++.
}

TEST(Architecture, NoDispatchOnFormatNames) {
  // A comparison with a format's name, either way round.
  const std::regex compare(R"re(([=!]=\s*"(uniform|anyprec|mixed24a?|quik)")|("(uniform|anyprec|mixed24a?|quik)"\s*[=!]=))re");
  for (const SourceFile& f : sources()) {
    if (f.rel == "tests/test_architecture.cpp") continue;
    for (auto it = std::sregex_iterator(f.text.begin(), f.text.end(), compare); it != std::sregex_iterator(); ++it)
      ADD_FAILURE() << f.rel << ":" << line_of(f.text, static_cast<size_t>(it->position()))
                    << ": compares a format name; switch on FormatId (formats/format_id.h) instead";
  }
}

}  // namespace
}  // namespace lowbit
