#include "model/random_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"

namespace lowbit {

namespace {

constexpr const char* kPrefix = "random:";
constexpr int kMaxLayers = 1024;   // the bound read_llama2c holds a header to

// Hugging Face config values of each shape. No tokenizer: the ids only fill the config.
struct Preset {
  const char* name;
  int dim, hidden, layers, heads, kv_heads, vocab, max_seq;
  float rope_theta;
  bool tied;
  int32_t bos, eos;
};
constexpr Preset kPresets[] = {
    // name           dim   hidden layers heads kv  vocab   max_seq rope_theta tied   bos     eos
    {"tiny",          64,   176,   2,     4,    2,  512,    256,    10000.0f,  false, 1,      2},
    {"smollm2-135m",  576,  1536,  30,    9,    3,  49152,  8192,   100000.0f, true,  0,      0},
    {"llama2-7b",     4096, 11008, 32,    32,   32, 32000,  4096,   10000.0f,  false, 1,      2},
    {"llama3-8b",     4096, 14336, 32,    32,   8,  128256, 8192,   500000.0f, false, 128000, 128001},
    {"llama2-70b",    8192, 28672, 80,    64,   8,  32000,  4096,   10000.0f,  false, 1,      2},
};

std::string usage() {
  std::string s = "random:<preset>[?layers=N&seed=S], presets: ";
  for (size_t i = 0; i < std::size(kPresets); ++i) s += (i ? ", " : "") + std::string(kPresets[i].name);
  return s;
}

// `value` as a whole decimal integer in [lo, hi], else a one-line error that says what was expected.
template <typename T>
T parse_override(const std::string& source, const std::string& key, const std::string& value, T lo, T hi,
                 const std::string& expected) {
  T v{};
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  LOWBIT_CHECK(ec == std::errc() && end == value.data() + value.size() && v >= lo && v <= hi, source,
               ": bad override ", key, "='", value, "', expected ", expected, " (", usage(), ")");
  return v;
}

// splitmix64's output function: a bijection of 64 bits with full avalanche, so consecutive counters give
// independent-looking outputs (splitmix64 is exactly mix64(seed + i * kGamma)).
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// The sum of four uniforms on {0..65535}: mean 2 * 65535, variance 4 * (65536^2 - 1) / 12.
constexpr float kSumMean = 2.0f * 65535.0f;
const double kSumStd = std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0);

// out[c] = offset + z_c * scale[c], z_c ~ approximately N(0, 1) from counter first + c. Branch-free and without
// cross-element dependences, so it vectorizes (AVX-512 has the 64-bit multiply; AVX2 emulates it).
void fill_row(uint64_t key, uint64_t first, const float* scale, float offset, float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const uint64_t z = mix64(key + (first + static_cast<uint64_t>(c)) * kGamma);
    const float s = static_cast<float>(z & 0xffff) + static_cast<float>((z >> 16) & 0xffff) +
                    static_cast<float>((z >> 32) & 0xffff) + static_cast<float>(z >> 48);
    out[c] = offset + (s - kSumMean) * scale[c];
  }
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool is_random_source(const std::string& path) { return path.rfind(kPrefix, 0) == 0; }

std::vector<std::string> random_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

std::vector<int64_t> random_outlier_columns(uint64_t seed, int64_t k) {
  if (k <= 0) return {};
  const int64_t n = std::min<int64_t>(
      k, std::max<int64_t>(1, std::llround(static_cast<double>(k) * kRandomOutlierColumnFraction)));
  std::vector<char> taken(static_cast<size_t>(k), 0);
  std::vector<int64_t> out;
  // A stream of its own per (seed, k): "outliers" in ASCII keeps it apart from the tensors' streams.
  uint64_t state = mix64(seed ^ 0x6f75746c69657273ull) ^ mix64(static_cast<uint64_t>(k));
  while (static_cast<int64_t>(out.size()) < n) {
    state += kGamma;
    const auto c = static_cast<int64_t>((static_cast<unsigned __int128>(mix64(state)) * static_cast<uint64_t>(k)) >> 64);
    if (taken[static_cast<size_t>(c)]) continue;
    taken[static_cast<size_t>(c)] = 1;
    out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void TensorGenerator::fill(const std::string& name, const std::vector<int64_t>& shape, float* out) const {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel == 0) return;
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = numel / cols;
  const bool norm = shape.size() == 1 && name.find("norm") != std::string::npos;
  const bool embedding = ends_with(name, "embed_tokens.weight") || name == "lm_head.weight";
  const bool linear = shape.size() == 2 && !embedding;
  const float std_dev = norm ? kRandomNormNoiseStd : kRandomWeightStd;
  std::vector<float> scale(static_cast<size_t>(cols), static_cast<float>(std_dev / kSumStd));
  if (linear)
    for (int64_t c : random_outlier_columns(seed_, cols)) scale[static_cast<size_t>(c)] *= kRandomOutlierColumnScale;
  const float offset = norm ? 1.0f : 0.0f;
  const uint64_t key = mix64(mix64(seed_ + kGamma) ^ fnv1a(name));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    fill_row(key, static_cast<uint64_t>(r * cols), scale.data(), offset, out + r * cols, cols);
}

WeightSet read_random_model(const std::string& source) {
  LOWBIT_CHECK(is_random_source(source), source, ": not a synthetic source (", usage(), ")");
  const std::string spec = source.substr(std::char_traits<char>::length(kPrefix));
  const size_t q = spec.find('?');
  const std::string preset_name = spec.substr(0, q);
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets)
    if (preset_name == p.name) preset = &p;
  LOWBIT_CHECK(preset != nullptr, source, ": unknown preset '", preset_name, "' (", usage(), ")");

  int layers = preset->layers;
  uint64_t seed = 0;
  if (q != std::string::npos) {
    const std::string query = spec.substr(q + 1);
    size_t pos = 0;
    while (pos <= query.size()) {
      const size_t amp = std::min(query.find('&', pos), query.size());
      const std::string item = query.substr(pos, amp - pos);
      const size_t eq = item.find('=');
      const std::string key = item.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
      if (key == "layers") {
        layers = parse_override<int>(source, key, value, 1, kMaxLayers,
                                    "an integer in [1, " + std::to_string(kMaxLayers) + "]");
      } else if (key == "seed") {
        seed = parse_override<uint64_t>(source, key, value, 0, UINT64_MAX, "an unsigned 64-bit integer");
      } else {
        fail(source, ": bad override '", item, "' (", usage(), ")");
      }
      pos = amp + 1;
    }
  }

  WeightSet ws;
  ws.path = source;
  ws.format = ModelFormat::Random;
  ModelConfig& c = ws.config;
  c.arch = "llama";
  // The canonical source string: what a written file records as its origin, and enough to regenerate it.
  c.name = std::string(kPrefix) + preset->name;
  std::string overrides;
  if (layers != preset->layers) overrides += "layers=" + std::to_string(layers);
  if (seed != 0) overrides += (overrides.empty() ? "" : "&") + std::string("seed=") + std::to_string(seed);
  if (!overrides.empty()) c.name += "?" + overrides;
  c.dim = preset->dim;
  c.hidden_dim = preset->hidden;
  c.n_layers = layers;
  c.n_heads = preset->heads;
  c.n_kv_heads = preset->kv_heads;
  c.head_dim = preset->dim / preset->heads;
  c.vocab_size = preset->vocab;
  c.max_seq_len = preset->max_seq;
  c.rope_theta = preset->rope_theta;
  c.rms_eps = 1e-5f;
  c.tie_embeddings = preset->tied;
  c.bos_id = preset->bos;
  c.eos_id = preset->eos;
  c.validate(source);

  const int64_t dim = c.dim, hid = c.hidden_dim, qd = c.q_dim(), kvd = c.kv_dim(), V = c.vocab_size;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorView t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = std::move(shape);
    t.nbytes = static_cast<uint64_t>(t.numel()) * sizeof(float);
    ws.tensors[name] = std::move(t);
  };
  add("model.embed_tokens.weight", {V, dim});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {dim});
    add(p + "self_attn.q_proj.weight", {qd, dim});
    add(p + "self_attn.k_proj.weight", {kvd, dim});
    add(p + "self_attn.v_proj.weight", {kvd, dim});
    add(p + "self_attn.o_proj.weight", {dim, qd});
    add(p + "post_attention_layernorm.weight", {dim});
    add(p + "mlp.gate_proj.weight", {hid, dim});
    add(p + "mlp.up_proj.weight", {hid, dim});
    add(p + "mlp.down_proj.weight", {dim, hid});
  }
  add("model.norm.weight", {dim});
  if (!c.tie_embeddings) add("lm_head.weight", {V, dim});
  ws.generator = std::make_shared<const TensorGenerator>(seed);
  return ws;
}

}  // namespace lowbit
