// lowbit::api::convert_to_hf: the model's fp32 runtime tensors (dequantized, q/k rows in Hugging Face's RoPE order)
// written as safetensors beside config.json and the tokenizer files.
#include "lowbit/convert.h"

#include <filesystem>

#include "api/internal.h"
#include "core/atomic_write.h"
#include "core/error.h"
#include "core/half.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace lowbit::api {

ConvertResult convert_to_hf(const std::string& in_path, const std::string& out_dir, const ConvertOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LOWBIT_CHECK(!out_dir.empty(), "convert: no output directory");
  if (fs::exists(out_dir, ec)) {
    LOWBIT_CHECK(fs::is_directory(out_dir, ec), out_dir, ": exists and is not a directory");
    LOWBIT_CHECK(opts.force || fs::is_empty(out_dir, ec), out_dir, ": directory is not empty (use --force to overwrite)");
  }
  LoadOptions lo;
  lo.tokenizer_path = opts.tokenizer_path;
  LOWBIT_CHECK(in_path.rfind("random:", 0) != 0, in_path, ": a random: source generates weights for timing "
               "quantization; there is no model to convert");
  auto model = lowbit::Model::load(in_path, lo);
  detail::check_tokenizer_option(model->weights().format, in_path, opts.tokenizer_path);
  LOWBIT_CHECK(!model->has_packed_weights(), in_path, ": holds quantized weights; convert exports fp models only");
  const ModelConfig& c = model->config();
  fs::create_directories(out_dir, ec);
  LOWBIT_CHECK(!ec, out_dir, ": cannot create directory: ", ec.message());
  const bool f16 = opts.dtype == FloatType::F16;
  std::vector<std::vector<uint16_t>> halves;
  std::vector<SafetensorsWriteTensor> tensors;
  for (const std::string& name : model->tensor_names()) {
    const float* data = model->tensor_f32(name);
    const auto& shape = model->tensor_shape(name);
    if (f16) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = f32_to_f16(data[i]);
      halves.push_back(std::move(h));
      tensors.push_back({name, DType::F16, shape, halves.back().data()});
    } else {
      tensors.push_back({name, DType::F32, shape, data});
    }
  }
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_atomically((fs::path(out_dir) / "config.json").string(), c.to_hf_json(f16 ? "float16" : "float32"));
  if (model->has_tokenizer()) write_tokenizer_json(model->tokenizer().vocab(), out_dir);
  ConvertResult r;
  r.out_dir = out_dir;
  r.tensors = static_cast<int>(tensors.size());
  r.tokenizer = model->has_tokenizer();
  return r;
}

}  // namespace lowbit::api
