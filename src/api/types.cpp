// The public enums' names, the process-wide settings (lowbit/system.h) and the mapping of a WeightSet onto ModelInfo.
#include <cblas.h>
#include <omp.h>

#include <atomic>

#include "api/internal.h"
#include "core/error.h"
#include "io/lowbit_file.h"
#include "lowbit/model.h"
#include "lowbit/system.h"

#ifdef LOWBIT_WITH_CUDA
// Declared here rather than through backend_cuda/common/common.h, which needs the CUDA headers this C++ library
// is compiled without; defined in backend_cuda/common/common.cu.
namespace lowbit::cuda {
bool device_available(std::string* why);
std::string device_name();
}  // namespace lowbit::cuda
#endif

namespace lowbit::api {

const char* format_name(ModelFormat f) {
  switch (f) {
    case ModelFormat::HuggingFace: return "huggingface";
    case ModelFormat::Gguf: return "gguf";
    case ModelFormat::Llama2c: return "llama2.c";
    case ModelFormat::Lowbit: return "lowbit";
    case ModelFormat::Random: return "random";
  }
  return "?";
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::Length: return "length";
    case StopReason::Context: return "context";
    case StopReason::Stop: return "stop";
    case StopReason::Cancelled: return "cancelled";
  }
  return "?";
}

namespace {
std::atomic<int> g_cpu_threads{0};   // set_cpu_threads' value (0: never called)
}  // namespace

void set_cpu_threads(int n) {
  LOWBIT_CHECK(n >= 1, "--threads must be >= 1, got ", n);
  g_cpu_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

namespace detail {
// OpenMP's thread count is a per-thread setting: a thread started after set_cpu_threads (a server's worker) would
// otherwise run with every core, and under load its spinning waits collapse throughput.
void apply_cpu_threads() {
  const int n = g_cpu_threads;
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}
}  // namespace detail

bool built_with_cuda() {
#ifdef LOWBIT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available(std::string* why) {
#ifdef LOWBIT_WITH_CUDA
  return cuda::device_available(why);
#else
  if (why != nullptr) *why = "this lowbit was built without CUDA";
  return false;
#endif
}

std::string cuda_device_name() {
#ifdef LOWBIT_WITH_CUDA
  return cuda_available() ? cuda::device_name() : std::string();
#else
  return std::string();
#endif
}

namespace detail {

ModelFormat public_format(lowbit::ModelFormat f) {
  switch (f) {
    case lowbit::ModelFormat::HuggingFace: return ModelFormat::HuggingFace;
    case lowbit::ModelFormat::Gguf: return ModelFormat::Gguf;
    case lowbit::ModelFormat::Llama2c: return ModelFormat::Llama2c;
    case lowbit::ModelFormat::Lowbit: return ModelFormat::Lowbit;
    case lowbit::ModelFormat::Random: return ModelFormat::Random;
  }
  fail("unknown model format ", static_cast<int>(f));
}

ModelInfo model_info(const ModelConfig& c, lowbit::ModelFormat format, const std::string& path) {
  ModelInfo m;
  m.path = path;
  m.format = public_format(format);
  m.arch = c.arch;
  m.name = c.name;
  m.dim = c.dim;
  m.hidden_dim = c.hidden_dim;
  m.n_layers = c.n_layers;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_kv_heads;
  m.head_dim = c.head_dim;
  m.vocab_size = c.vocab_size;
  m.max_seq_len = c.max_seq_len;
  m.rope_theta = c.rope_theta;
  m.llama3_rope_scaling = c.rope_scaling == RopeScaling::Llama3;
  m.rms_eps = c.rms_eps;
  m.tie_embeddings = c.tie_embeddings;
  m.qkv_bias = c.qkv_bias;
  m.bos_id = c.bos_id;
  m.eos_id = c.eos_id;
  if (format == lowbit::ModelFormat::Lowbit) m.quantization = lowbit_method_json(path);
  return m;
}

void check_tokenizer_option(lowbit::ModelFormat format, const std::string& path, const std::string& tokenizer_path) {
  LOWBIT_CHECK(tokenizer_path.empty() || format == lowbit::ModelFormat::Llama2c, "--tokenizer applies to llama2.c "
               "checkpoints only; ", path, " (", model_format_name(format), ") ",
               format == lowbit::ModelFormat::Random ? "has no tokenizer (its calibration is random token ids)"
                                                     : "carries its own tokenizer");
}

}  // namespace detail
}  // namespace lowbit::api
