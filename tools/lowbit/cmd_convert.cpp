// lowbit convert IN OUT_DIR: GGUF or llama2.c (or HF) -> Hugging Face directory (config.json, model.safetensors,
// tokenizer.json + tokenizer_config.json), fp32 or fp16. q/k rows are written in Hugging Face's RoPE order,
// so transformers and lowbit load the result with identical logits.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/atomic_write.h"
#include "core/error.h"
#include "core/half.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace lowbit::cli {

void register_convert(CLI::App& app, Common& common) {
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("f32");
  auto force = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("convert", "Convert a GGUF / llama2.c model to a Hugging Face directory");
  sub->add_option("input", *in, "Model: .gguf, llama2.c .bin, or HF directory")->required();
  sub->add_option("output", *out, "Output directory (created)")->required();
  sub->add_option("--dtype", *dtype, "f32 or f16")->check(CLI::IsMember({"f32", "f16"}));
  sub->add_flag("--force", *force, "Overwrite files in an existing output directory");
  sub->add_option("--tokenizer", common.tokenizer, "Tokenizer file for llama2.c checkpoints");
  sub->callback([in, out, dtype, force, &common] {
    namespace fs = std::filesystem;
    apply_threads(common);
    std::error_code ec;
    if (fs::exists(*out, ec)) {
      LOWBIT_CHECK(fs::is_directory(*out, ec), *out, ": exists and is not a directory");
      LOWBIT_CHECK(*force || fs::is_empty(*out, ec), *out, ": directory is not empty (use --force to overwrite)");
    }
    LoadOptions lo;
    lo.tokenizer_path = common.tokenizer;
    auto model = Model::load(*in, lo);
    LOWBIT_CHECK(!model->has_packed_weights(), *in, ": holds quantized weights; convert exports fp models only");
    const ModelConfig& c = model->config();
    fs::create_directories(*out, ec);
    LOWBIT_CHECK(!ec, *out, ": cannot create directory: ", ec.message());
    const bool f16 = *dtype == "f16";
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
    write_safetensors((fs::path(*out) / "model.safetensors").string(), tensors, {{"format", "pt"}});
    write_atomically((fs::path(*out) / "config.json").string(), c.to_hf_json(f16 ? "float16" : "float32"));
    if (model->has_tokenizer()) write_tokenizer_json(model->tokenizer().vocab(), *out);
    std::printf("wrote %s: config.json, model.safetensors (%zu tensors, %s)%s\n", out->c_str(), tensors.size(),
                dtype->c_str(), model->has_tokenizer() ? ", tokenizer.json, tokenizer_config.json" : "");
  });
}

}  // namespace lowbit::cli
