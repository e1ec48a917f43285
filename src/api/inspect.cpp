// lowbit::api::inspect: a WeightSet (the file as stored, nothing converted) described tensor by tensor.
#include "lowbit/inspect.h"

#include <map>

#include "api/internal.h"
#include "core/error.h"
#include "core/tensor.h"
#include "formats/anyprec/layout.h"
#include "formats/format_table.h"
#include "model/weight_set.h"

namespace lowbit::api {

std::string shape_string(const std::vector<int64_t>& shape) { return shape_str(shape); }

FileInfo inspect(const std::string& path, const InspectOptions& opts) {
  LoadOptions lo;
  lo.tokenizer_path = opts.tokenizer_path;
  const WeightSet ws = read_weights(path, lo);
  detail::check_tokenizer_option(ws.format, path, opts.tokenizer_path);
  FileInfo out;
  out.model = detail::model_info(ws.config, ws.format, ws.path);
  if (ws.vocab) {
    const VocabData& v = *ws.vocab;
    out.tokenizer.present = true;
    out.tokenizer.kind = v.kind == TokenizerKind::ByteLevelBpe ? "byte-level BPE" : "SentencePiece BPE";
    out.tokenizer.pretokenizer = v.kind == TokenizerKind::ByteLevelBpe ? v.pre : "";
    out.tokenizer.tokens = static_cast<int>(v.tokens.size());
    out.tokenizer.bos_id = v.bos_id;
    out.tokenizer.eos_id = v.eos_id;
    out.tokenizer.chat_template = !v.chat_template.empty();
  }

  std::map<std::string, DTypeTotal> by_type;
  for (const auto& [name, t] : ws.tensors) {
    TensorInfo ti;
    ti.name = name;
    ti.dtype = std::string(dtype_info(t.dtype).name);
    ti.shape = t.shape;
    ti.bytes = t.nbytes;
    out.params += t.numel();
    out.dense_bytes += t.nbytes;
    DTypeTotal& bt = by_type[ti.dtype];
    bt.dtype = ti.dtype;
    bt.params += t.numel();
    bt.bytes += t.nbytes;
    out.tensors.push_back(std::move(ti));
  }
  for (auto& [type, total] : by_type) out.dtype_totals.push_back(total);

  for (const auto& [name, w] : ws.packed) {
    PackedTensorInfo pi;
    pi.name = name;
    pi.format = std::string(lowbit::format_name(w.format));
    pi.shape = w.shape;
    pi.stored_bits = packed_stored_bits(w, ws.path + ": " + name);
    for (const auto& [k, v] : w.params) pi.params.emplace_back(k, v);
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    out.packed_params += n;
    out.packed_bits += static_cast<double>(pi.stored_bits);
    out.packed.push_back(std::move(pi));
  }
  out.params += out.packed_params;

  // Any-precision widths: the widths every anyprec weight serves. A separately quantized b-bit model of this format
  // stores exactly what the b-bit view reads, so their sum is the "one model per width" alternative.
  uint32_t common = ~0u;
  bool any = false;
  for (const auto& [name, w] : ws.packed)
    if (w.format == FormatId::AnyPrec) {
      common &= static_cast<uint32_t>(w.params.at("widths"));
      any = true;
    }
  if (any) {
    const double dense = static_cast<double>(out.dense_bytes);
    for (int b = 0; b < 32; ++b) {
      if (((common >> b) & 1u) == 0) continue;
      double bytes = 0;
      for (const auto& [name, w] : ws.packed)
        bytes += w.format == FormatId::AnyPrec ? static_cast<double>(anyprec_view_bits(w, b)) / 8.0
                                               : static_cast<double>(packed_stored_bits(w, ws.path + ": " + name)) / 8.0;
      WidthRead wr;
      wr.bits = b;
      wr.bits_per_weight = 8.0 * bytes / static_cast<double>(out.packed_params);
      wr.quantized_bytes = bytes;
      wr.model_bytes = bytes + dense;
      out.separate_models_bytes += wr.model_bytes;
      out.widths.push_back(wr);
    }
    out.parent_bytes = out.packed_bits / 8.0 + dense;
  }
  return out;
}

}  // namespace lowbit::api
