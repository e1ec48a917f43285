// --device for ppl / generate / bench: where the forward runs.
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#ifdef LOWBIT_WITH_CUDA
#include "cuda/common.h"
#endif

namespace lowbit::cli {

void add_device_option(CLI::App* sub, std::string& device) {
  sub->add_option("--device", device, "auto (the GPU when one is present and runs this model), cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
}

bool use_cuda(const std::string& device, const Model& model, bool cpu_only) {
  if (device == "cpu") return false;
  std::string why;
#ifdef LOWBIT_WITH_CUDA
  const bool gpu = cuda::device_available(&why);
#else
  const bool gpu = false;
  why = "this lowbit was built without CUDA";
#endif
  bool quik = false;
  for (const auto& [name, pw] : model.weights().packed) quik = quik || pw.format == "quik";
  if (device == "cuda") {
    LOWBIT_CHECK(gpu, "--device cuda: ", why);
    LOWBIT_CHECK(!quik, "--device cuda: QUIK models run on the CPU for now (--device cpu)");
    LOWBIT_CHECK(!cpu_only, "--device cuda: --reference runs on the CPU");
    return true;
  }
  return gpu && !quik && !cpu_only;
}

std::string device_description() {
#ifdef LOWBIT_WITH_CUDA
  return "cuda: " + cuda::device_name();
#else
  return "cpu";
#endif
}

}  // namespace lowbit::cli
