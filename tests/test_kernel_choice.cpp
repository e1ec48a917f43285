// The GPU kernel choice (src/backend_cuda/dispatch/kernel_choice.h) is plain C++: pinned here, without a GPU.
//
// The golden tables in tests/fixtures/kernel_choice/ hold one line per (format, width, shape, batch): the kernel the
// runtime runs. A change to a rule shows up as a diff of these files; regenerate them with
//   LOWBIT_SOURCE_DIR=$PWD build/test_kernel_choice --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Write*'
// and review the diff (each changed line should be backed by a `lowbit bench --kernels` measurement).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "backend_cuda/dispatch/kernel_choice.h"
#include "core/knobs.h"
#include "test_util.h"

namespace lowbit::cuda {
namespace {

GpuInfo hopper() { return GpuInfo{9, 0, 132, true}; }
GpuInfo ampere() { return GpuInfo{8, 0, 108, true}; }   // no wgmma: the staged GEMM's wider batch range

std::string golden(const std::string& name) { return test::fixture("kernel_choice/" + name); }

void expect_table(const GpuInfo& gpu, const std::string& name) {
  const std::string want = test::read_file(golden(name));
  const std::string got = kernel_choice_table(gpu, false);
  if (got == want) return;
  const std::string out = test::temp_dir() + "/" + name;
  test::write_file(out, got);
  ADD_FAILURE() << "the kernel choice for " << name << " changed; the new table is " << out << " (diff it against "
                << golden(name) << "; regenerate the goldens as this file's comment says once each change is measured)";
}

TEST(KernelChoice, PinnedTableHopper) { expect_table(hopper(), "hopper.txt"); }
TEST(KernelChoice, PinnedTableWithoutWgmma) { expect_table(ampere(), "ampere.txt"); }

TEST(KernelChoice, DISABLED_WriteGoldens) {
  test::write_file(golden("hopper.txt"), kernel_choice_table(hopper(), false));
  test::write_file(golden("ampere.txt"), kernel_choice_table(ampere(), false));
}

// The candidates before the chosen one each say why they cannot run; the chosen one is among the candidates.
TEST(KernelChoice, ReasonsForEveryRejection) {
  for (int64_t m : {1, 2, 4, 8, 16, 64, 512})
    for (int bits = 2; bits <= 8; ++bits) {
      const LinearProblem p{FormatId::AnyPrec, 4096, 11008, m, bits, true};
      const KernelChoice c = choose_kernel(p, hopper());
      std::set<Kernel> listed;
      for (const KernelCandidate& k : kernel_candidates(p)) listed.insert(k.kernel);
      EXPECT_TRUE(listed.count(c.kernel));
      for (const auto& [k, why] : c.rejected) {
        EXPECT_FALSE(why.empty()) << kernel_name(k);
        EXPECT_EQ(why.find('\n'), std::string::npos);
        EXPECT_NE(k, c.kernel);
      }
    }
}

// Representative choices, spelled out (the golden tables hold them all).
TEST(KernelChoice, KnownChoices) {
  const GpuInfo h = hopper();
  auto ap = [&](int64_t n, int64_t k, int64_t m, int bits) { return choose_kernel({FormatId::AnyPrec, n, k, m, bits, true}, h).kernel; };
  auto mx = [&](int64_t n, int64_t k, int64_t m) { return choose_kernel({FormatId::Mixed24A, n, k, m, 0, true}, h).kernel; };
  auto fp = [&](int64_t n, int64_t k, int64_t m) { return choose_kernel({std::nullopt, n, k, m, 0, true}, h).kernel; };
  EXPECT_EQ(ap(28672, 8192, 1, 3), Kernel::AnyPrecInt8Stream);
  EXPECT_EQ(ap(576, 576, 1, 3), Kernel::AnyPrecRegLut);              // k < 2048: no streamed kernel
  EXPECT_EQ(ap(4096, 4096, 1, 8), Kernel::AnyPrecSharedLutStream);
  EXPECT_EQ(ap(28672, 8192, 1, 6), Kernel::AnyPrecSharedLut);        // 5..7 bits on 128M+ weights
  EXPECT_EQ(ap(576, 576, 1, 8), Kernel::AnyPrecCudaCores);
  EXPECT_EQ(ap(4096, 4096, 16, 3), Kernel::AnyPrecTwoTiles);
  EXPECT_EQ(ap(4096, 4096, 64, 3), Kernel::AnyPrecStaged);
  EXPECT_EQ(ap(4096, 4096, 512, 4), Kernel::AnyPrecWgmmaWs);
  EXPECT_EQ(ap(4096, 4096, 2048, 4), Kernel::DequantCublas);
  EXPECT_EQ(ap(4096, 4096, 64, 8), Kernel::DequantCublas);           // no fused GEMM at 5..8 bits above batch 16
  EXPECT_EQ(mx(28672, 8192, 1), Kernel::Mixed24aDp);
  EXPECT_EQ(mx(28672, 8192, 4), Kernel::Mixed24aInt8Mma);
  EXPECT_EQ(mx(28672, 8192, 8), Kernel::Mixed24aTcStream);
  EXPECT_EQ(mx(576, 576, 8), Kernel::Mixed24aCudaCores);              // 576 is not a multiple of 256
  EXPECT_EQ(mx(4096, 4096, 16), Kernel::Mixed24aTwoTiles);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 28672, 8192, 1, 0, true}, h).kernel, Kernel::UniformGemv);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 576, 576, 8, 0, true}, h).kernel, Kernel::UniformGemv);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 9, 0, true}, h).kernel, Kernel::DequantCublas);   // width unknown
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 2048, 4, true, 128}, h).kernel, Kernel::UniformFused);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 2048, 8, true, 0}, h).kernel, Kernel::UniformFused);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 2048, 4, true, 128, true}, h).kernel, Kernel::DequantCublas);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 2048, 3, true, 128}, h).kernel, Kernel::DequantCublas);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 2048, 4, true, 32}, h).kernel, Kernel::DequantCublas);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 2048, 4, true, 128}, ampere()).kernel, Kernel::DequantCublas);
  EXPECT_EQ(choose_kernel({FormatId::Uniform, 4096, 4096, 2048, 4, true, 128}, GpuInfo{9, 0, 132, true, false}).kernel,
            Kernel::DequantCublas);   // built without CUTLASS
  EXPECT_EQ(choose_kernel({FormatId::Quik, 4096, 4096, 8, 0, true}, h).kernel, Kernel::QuikGemv);
  EXPECT_EQ(choose_kernel({FormatId::Quik, 4096, 4096, 9, 0, true}, h).kernel, Kernel::QuikGemm);
  EXPECT_EQ(fp(4096, 4096, 1), Kernel::DenseGemv);
  EXPECT_EQ(fp(4096, 4096, 3), Kernel::Cublas);
  EXPECT_EQ(choose_kernel({FormatId::AnyPrec, 4096, 4096, 512, 4, true}, ampere()).kernel, Kernel::DequantCublas);
  EXPECT_EQ(choose_kernel({FormatId::AnyPrec, 4096, 8192, 100, 4, true}, ampere()).kernel, Kernel::AnyPrecStaged);
}

// A knob that turns a kernel off moves the choice to the next candidate and says so.
TEST(KernelChoice, KnobsMoveTheChoice) {
  set_knob(Knob::Int8Tables, 0);
  const KernelChoice c = choose_kernel({FormatId::AnyPrec, 28672, 8192, 1, 3, true}, hopper());
  reset_knob(Knob::Int8Tables);
  EXPECT_EQ(c.kernel, Kernel::AnyPrecRegLutStream);
  ASSERT_FALSE(c.rejected.empty());
  EXPECT_EQ(c.rejected[0].second, "LOWBIT_INT8_TABLES=0");
  set_knob(Knob::FusedGemm, 0);
  EXPECT_EQ(choose_kernel({FormatId::AnyPrec, 4096, 4096, 64, 3, true}, hopper()).kernel, Kernel::DequantCublas);
  EXPECT_EQ(choose_kernel({FormatId::Mixed24A, 4096, 4096, 16, 0, true}, hopper()).kernel, Kernel::DequantCublas);
  reset_knob(Knob::FusedGemm);
  EXPECT_EQ(choose_kernel({FormatId::AnyPrec, 28672, 8192, 1, 3, true}, hopper()).kernel, Kernel::AnyPrecInt8Stream);
}

// Formats without packed GPU kernels are refused by name, with the way they run.
TEST(KernelChoice, FormatsWithoutPackedKernelsAreRefused) {
  for (FormatId f : {FormatId::Mixed24}) {
    try {
      choose_kernel({f, 64, 64, 1, 4, true}, hopper());
      ADD_FAILURE() << format_name(f);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(format_name(f))), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(choose_kernel({FormatId::AnyPrec, 0, 64, 1, 4, true}, hopper()), Error);
}

}  // namespace
}  // namespace lowbit::cuda
