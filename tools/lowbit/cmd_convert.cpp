// lowbit convert IN OUT_DIR: GGUF or llama2.c (or HF) -> Hugging Face directory (see include/lowbit/convert.h).
#include <cstdio>

#include "commands.h"

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
    apply_threads(common);
    api::ConvertOptions o;
    o.dtype = *dtype == "f16" ? api::FloatType::F16 : api::FloatType::F32;
    o.force = *force;
    o.tokenizer_path = common.tokenizer;
    const api::ConvertResult r = api::convert_to_hf(*in, *out, o);
    std::printf("wrote %s: config.json, model.safetensors (%d tensors, %s)%s\n", r.out_dir.c_str(), r.tensors,
                dtype->c_str(), r.tokenizer ? ", tokenizer.json, tokenizer_config.json" : "");
  });
}

}  // namespace lowbit::cli
