// The quantization driver: model in, .lowbit file out.
//   RTN   — every linear weight rounded on its own (no calibration).
//   GPTQ  — sequential, block by block like the GPTQ reference: the calibration windows are embedded, then for each
//           transformer block the inputs of its linears are captured (InputStats: H = 2/N XᵀX and column stats),
//           its seven linears are quantized with GPTQ, and the block is re-run with the quantized weights to give the
//           next block its inputs (`sequential`; off: the next block sees full-precision outputs).
// The runtime never includes this (STYLE: the quantizer writes, the runtime loads).
#pragma once
#include <functional>
#include <map>
#include <string>

#include "model/model.h"
#include "quantize/anyprec.h"
#include "quantize/calibration.h"
#include "quantize/gptq.h"
#include "quantize/mixed24.h"
#include "quantize/quik.h"

namespace lowbit {

enum class QuantMethod { Rtn, Gptq, AnyPrec, Mixed24, Quik };
// Per-weight sensitivity for the any-precision k-means: the empirical Fisher diagonal (squared gradients of the
// loss, SqueezeLLM), or the input Hessian diagonal 2/N Σ x_c^2 of the weight's column (same for every row).
enum class Sensitivity { Fisher, HessianDiag };

struct QuantizeOptions {
  QuantMethod method = QuantMethod::Gptq;
  GptqOptions gptq;                 // .spec is used by RTN too
  CalibOptions calib;
  bool sequential = true;           // later blocks see the quantized earlier blocks
  DType dense_dtype = DType::F32;   // unquantized tensors (embeddings, norms, head, biases): F32 or F16
  AnyPrecOptions anyprec;           // AnyPrec only
  Mixed24Options mixed24;           // Mixed24 only (calibrated and sequential like GPTQ)
  QuikOptions quik;                 // Quik only (calibrated and sequential like GPTQ; activations unquantized while
                                    // calibrating, so every abits shares the weights of one wbits/outlier setting)
  // Mixed24 ablation "manual inter-layer": these linear kinds (q, k, v, o, gate, up, down) entirely at 4 bits,
  // all others entirely at 2 bits, instead of the per-group allocation.
  std::vector<std::string> mixed24_layers_4bit;
  Sensitivity sensitivity = Sensitivity::Fisher;
  // AnyPrec: a safetensors file of sensitivities. Read when it exists (it must have been made for the same model,
  // sensitivity kind and calibration — else a clear error), written (atomically) when it does not.
  std::string sensitivity_cache;
  // GPU driver only (quantize_to_file_gpu): continue from the checkpoint an interrupted run left beside the output.
  bool resume = false;
};

struct QuantizeReport {
  double seconds = 0, calib_seconds = 0;
  int calib_windows = 0, calib_seqlen = 0;
  int64_t quantized_weights = 0;
  double avg_bits = 0;              // exact, every stored bit of the quantized weights counted
  uint64_t file_bytes = 0;
  double hessian_error_sum = 0;     // Σ over layers of the GPTQ objective (GPTQ only)
  double rtn_hessian_error_sum = 0; // the same objective for RTN of each layer on the same Hessians (GPTQ only)
  int64_t outliers = 0;             // Mixed24: fp16 outliers kept
  // Mixed24: the paper's way of counting (eq. 10 as we read it): codes, first-order scales (or scale codes) and
  // zeros, and 16 bits per outlier value; second-order step/offset, outlier indices and row pointers, the group
  // permutation and word padding left out. avg_bits is the honest figure.
  double paper_avg_bits = 0;
  int mixed24_aligned_linears = 0, mixed24_generic_linears = 0;
  int64_t quik_outlier_columns = 0;   // Quik: fp16 input columns kept, summed over linears
  int quik_linears_without_outliers = 0;   // Quik: linears the threshold left without outliers
  double sensitivity_seconds = 0;   // AnyPrec: Fisher (forward + backward) or Hessian-diagonal capture
  bool sensitivity_from_cache = false;
  double mean_calib_loss = 0;       // AnyPrec with Fisher: mean loss of the calibration windows
  std::map<int, double> width_avg_bits;   // AnyPrec: exact bits per weight a b-bit view reads
  std::map<int, double> width_weighted_error;   // AnyPrec: Σ sensitivity · (w - ŵ_b)^2 over all layers
  // Where the time went (seconds by stage: load, embed, capture, hessian, solve, fisher, kmeans, pack, checkpoint,
  // replay, write), the peaks, and what ran it.
  std::map<std::string, double> stage_seconds;
  uint64_t peak_gpu_bytes = 0;      // device memory in use at its highest sampled point (GPU driver)
  uint64_t peak_rss_bytes = 0;      // VmHWM: peak host resident memory (mapped model pages included)
  uint64_t peak_anon_rss_bytes = 0; // peak anonymous host memory sampled at the driver's high points
  std::string device;               // "cpu" or the GPU's name
  int resumed_blocks = 0;           // blocks taken from a checkpoint
  bool activations_on_host = false; // GPU driver: calibration activations spilled to pinned host memory
};

// progress(done, total, what): one call per finished block.
QuantizeReport quantize_to_file(Model& model, const QuantizeOptions& opts, const std::string& out_path,
                                const std::function<void(int, int, const std::string&)>& progress = nullptr);

// The streaming GPU driver (src/backend_cuda/quantize/quantize_gpu.cu; CUDA builds only): the same options and the
// same file as quantize_to_file, with the model read block by block from the file as stored (no fp32 copy of the
// whole model on the host or the device), every calibration stage on the GPU, and a checkpoint per block.
QuantizeReport quantize_to_file_gpu(const WeightSet& ws, const QuantizeOptions& opts, const std::string& out_path,
                                    const std::function<void(int, int, const std::string&)>& progress = nullptr);

// Bits the paper's eq. 10 counts for one mixed24 linear (QuantizeReport::paper_avg_bits' numerator).
double mixed24a_paper_bits(const Mixed24AQuantized& q, int64_t outliers);
double mixed24_paper_bits(const Mixed24Quantized& q, int64_t outliers);

// The method description stored in the file ({"name": "gptq", "bits": 4, ...}).
std::string method_json(const QuantizeOptions& opts);

}  // namespace lowbit
