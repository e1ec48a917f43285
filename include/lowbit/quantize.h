// lowbit::api::quantize: a model in (Hugging Face directory, .gguf, llama2.c .bin), a .lowbit file out. The
// quantizer only writes; Model::open reads the file back on any device.
//
//   lowbit::api::QuantizeOptions o;
//   o.method = lowbit::api::QuantMethod::AnyPrec;          // one 8-bit parent serving 3, 4 and 8 bits
//   o.anyprec.widths = {3, 4, 8};
//   o.calib.samples = 8;                                    // calibration windows (default 100 for anyprec)
//   lowbit::api::quantize("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2.anyprec-3to8.lowbit", o,
//                         [](const lowbit::api::QuantizeProgress& p) { std::printf("%d/%d\n", p.done, p.total); });
//
// Methods and the option groups each reads (the others are ignored by the library; the CLI refuses them):
//   Rtn      round to nearest per group                                  uniform
//   Gptq     GPTQ, sequential block by block on calibration inputs      uniform, gptq, calib, percdamp
//   AnyPrec  any-precision bitplanes (Park et al. 2024): a k-means seed  anyprec, calib
//            upscaled to a parent whose top b bits serve width b
//   Mixed24  2/4-bit groups of 16 with fp16 outliers (GPTQ feedback)     mixed24, calib, percdamp
//   Quik     QUIK: 4/8-bit weights, fp16 outlier input columns,          quik, calib, percdamp
//            quantized activations
// Errors (lowbit::Error, one line): options out of range (checked by validate() before the model is read), an
// input that is already quantized, an output whose directory is missing, evaluation text given as calibration data.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lowbit/types.h"

namespace lowbit::api {

enum class QuantMethod { Rtn, Gptq, AnyPrec, Mixed24, Quik };
const char* method_name(QuantMethod m);   // "rtn", "gptq", "anyprec", "mixed24", "quik"

// Integer weights with a scale and zero per group of inputs (Rtn, Gptq).
struct UniformOptions {
  int bits = 4;                  // 2..8
  int group_size = 0;            // >= 0: consecutive inputs sharing a scale and zero (0 = the whole row)
  bool symmetric = false;        // zero point fixed at the middle of the grid
  bool mse_clip = false;         // search each group's clipping range for the least |err|^2.4
};

struct GptqOptions {
  bool act_order = false;        // quantize columns by decreasing Hessian diagonal
  bool static_groups = false;    // act_order: group parameters from the original column order
};

// Per-weight sensitivity the any-precision k-means weights its clusters by.
enum class Sensitivity {
  Fisher,            // the empirical Fisher diagonal: squared gradients of the calibration loss (SqueezeLLM)
  HessianDiagonal,   // the input Hessian diagonal 2/N sum x_c^2 of each weight's column (no backward pass)
};

struct AnyPrecOptions {
  int seed_bits = 3;             // 2..8: bits of the k-means seed (the narrowest width)
  int parent_bits = 8;           // seed_bits..8: the width the seed is upscaled to (the file stores its bitplanes)
  std::vector<int> widths;       // widths served (lookup tables stored), each in seed..parent, parent included;
                                 // empty = every width seed..parent
  Sensitivity sensitivity = Sensitivity::Fisher;
  // A safetensors file of sensitivities: read when it exists (it must come from the same model, sensitivity and
  // calibration, else an Error), written when it does not. "" = none.
  std::string sensitivity_cache;
  int kmeans_iters = 100;        // >= 0: Lloyd iteration cap of the seed
  double outlier_fraction = 0;   // [0, 0.5): weights kept in fp16 (CSR), the most sensitive ones
};

// Linear layers of a transformer block.
enum class LinearKind { Q, K, V, O, Gate, Up, Down };

struct Mixed24Options {
  double ratio_4bit = 0.25;              // [0, 1]: fraction of 16-input groups at 4 bits (the rest 2 bits)
  double outlier_fraction = 0.002;       // [0, 0.02]: weights kept in fp16
  bool outliers_from_all_groups = false; // take outliers from every group (ablation); default: 2-bit groups only
  enum class Layout {
    Auto,      // the aligned layout (mixed24a, GPU kernels) wherever a linear fits it, else generic
    Aligned,   // mixed24a everywhere (needs k % 64 == 0, ratio_4bit 0.25, no layers_4bit)
    Generic,   // the generic mixed24 layout everywhere
  } layout = Layout::Auto;
  bool unit_order_by_sensitivity = true; // mixed24a: units (and GPTQ's order) by decreasing sensitivity, else by column
  std::vector<LinearKind> layers_4bit;   // ablation: these linears wholly 4-bit, the rest wholly 2-bit (no allocation)
};

struct QuikOptions {
  int wbits = 4;                  // 4 or 8
  int abits = 8;                  // activation bits at run time: 4, 8, or 16 (not quantized)
  bool act_fp8 = false;           // FP8-E4M3 activations with a per-token scale (wbits 4, abits 8)
  int64_t outlier_columns = -1;   // fp16 input columns of a dim-wide input (>= 0), or -1: outlier_frac of dim
  double outlier_frac = 0.0625;   // [0, 1]: outlier columns as a fraction of dim (the paper's 256 of 4096)
  double outlier_threshold = 0;   // >= 0: a linear whose calibration inputs never exceed this max |x| keeps no
                                  // outlier columns (0 = off)
  bool int8_down_proj = false;    // down_proj at W8A8
  bool clip = false;              // search each row's weight clipping on the squared error
};

// Calibration data (every method but Rtn).
struct CalibrationOptions {
  std::string file;               // plain text or .jsonl ("" = the C4 sample shipped with the shared data)
  std::string jsonl_field = "text";
  int samples = 0;                // windows drawn (0 = the method's default: 128; anyprec 100)
  int seqlen = 0;                 // tokens per window (0 = the method's default: 2048; anyprec 512)
  uint64_t seed = 0;              // seed for the windows' random offsets
  bool sequential = true;         // Gptq / Mixed24 / Quik: each block calibrates on the quantized earlier blocks
};

struct QuantizeOptions {
  QuantMethod method = QuantMethod::Gptq;
  UniformOptions uniform;         // Rtn, Gptq
  GptqOptions gptq;               // Gptq
  AnyPrecOptions anyprec;         // AnyPrec
  Mixed24Options mixed24;         // Mixed24
  QuikOptions quik;               // Quik
  CalibrationOptions calib;       // all but Rtn
  double percdamp = 0.01;         // Gptq / Mixed24 / Quik: Hessian damping as a fraction of mean(diag H), (0, 10]
  FloatType dense_dtype = FloatType::F32;   // unquantized tensors (embeddings, norms, head, biases)
  std::string tokenizer_path;     // llama2.c inputs: the tokenizer file (see OpenOptions::tokenizer_path)
  // Where the quantizer runs. Cuda: the model streamed block by block from the file (no full copy in host or GPU
  // memory), every calibration stage on the GPU, one checkpoint per block; Cpu: the reference path (the whole model
  // in fp32 host memory). Auto: Cuda when a GPU is present, else Cpu.
  Device device = Device::Auto;
  // Cuda: continue from the checkpoint (`<out>.partial/`) an interrupted run left; without it such a checkpoint is
  // refused rather than overwritten.
  bool resume = false;
};

// Where a running quantization is.
struct QuantizeProgress {
  enum class Stage {
    Sensitivity,   // AnyPrec with Fisher: done/total calibration windows (Cpu) or block passes, forward and back (Cuda)
    Blocks,        // transformer blocks quantized (done/total blocks)
  } stage = Stage::Blocks;
  int done = 0;
  int total = 0;
};
using QuantizeProgressFn = std::function<void(const QuantizeProgress&)>;

struct QuantizeReport {
  std::string out_path;
  double seconds = 0;                     // the whole run, reading the input included
  int blocks = 0;                         // transformer blocks quantized
  int calib_windows = 0, calib_seqlen = 0;   // calibration used (0 for Rtn)
  int64_t quantized_weights = 0;          // weights in the packed linears
  double avg_bits = 0;                    // stored bits per quantized weight: codes, scales, zeros, LUTs,
                                          // indices and outliers all counted
  uint64_t file_bytes = 0;
  // Gptq / Mixed24 / Quik: sum over linears of the layer objective tr(dW H dW^T); Gptq also gives RTN's on the
  // same Hessians (what the error feedback bought).
  double hessian_error_sum = 0, rtn_hessian_error_sum = 0;
  // AnyPrec.
  double sensitivity_seconds = 0;         // the Fisher pass or the Hessian-diagonal capture
  bool sensitivity_from_cache = false;
  double mean_calib_loss = 0;             // Fisher: mean loss of the calibration windows
  std::map<int, double> width_bits;       // width -> bits per weight a forward at that width reads
  std::map<int, double> width_weighted_error;   // width -> sum of sensitivity * (w - w_hat)^2
  // Mixed24.
  int64_t outliers = 0;
  double paper_avg_bits = 0;              // the paper's count (codes, first-order scales and zeros, fp16 outliers)
  int aligned_linears = 0, generic_linears = 0;
  // Quik.
  int64_t quik_outlier_columns = 0;       // fp16 input columns kept, summed over linears
  int quik_linears_without_outliers = 0;  // linears the threshold left without outliers
  // Where it ran and where the time and memory went.
  std::string device;                     // "cpu" or the GPU's name
  std::map<std::string, double> stage_seconds;   // load, embed, capture, hessian, solve, fisher, kmeans, pack,
                                                 // checkpoint, replay, write (those that ran)
  uint64_t peak_gpu_bytes = 0;            // device memory in use at its highest sampled point (Cuda)
  uint64_t peak_rss_bytes = 0;            // peak host resident memory (VmHWM: mapped model pages included)
  uint64_t peak_anon_rss_bytes = 0;       // peak host anonymous memory (heap), sampled (Cuda)
  int resumed_blocks = 0;                 // blocks taken from a checkpoint
  bool activations_on_host = false;       // Cuda: calibration activations kept in pinned host memory
};

// Refuses options out of range for the chosen method (Error naming the option); quantize() calls it first.
void validate(const QuantizeOptions& opts);
// One line describing what quantize() will do, defaults resolved, e.g.
// "anyprec, seed 3 bits upscaled to 8, widths 3,4,8, fisher sensitivity, calibration 8 x 512".
std::string describe(const QuantizeOptions& opts);
// Quantizes the model at in_path into out_path (written atomically: a failed run leaves no file).
QuantizeReport quantize(const std::string& in_path, const std::string& out_path, const QuantizeOptions& opts,
                        const QuantizeProgressFn& progress = nullptr);

}  // namespace lowbit::api
