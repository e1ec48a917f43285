// Loss and parameter gradients of the fp32 CPU model, for calibration (the Fisher-weighted quantizers) and tests.
//
// Loss = mean cross-entropy over the predicted positions of one sequence (token t predicts token t+1), exactly the
// `loss` Hugging Face returns for labels = input_ids. The gradients are those of that loss with respect to every
// parameter tensor, under the canonical (Hugging Face) names and layouts of Model::tensor_f32.
//
// Two paths with one contract, as for the forward:
//   loss_and_gradients() — one forward that keeps the activations each backward step needs, then the backward;
//                          OpenBLAS sgemm for every matmul, OpenMP for the element-wise work, fp32 throughout.
//   loss_reference()     — scalar loops in double precision, loss only, with optional weight overrides: the oracle
//                          for finite-difference tests (the model's weights are read-only, often mmapped).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/model.h"

namespace lowbit {

struct Gradients {
  double loss = 0;          // mean cross-entropy over `predicted` positions
  int64_t predicted = 0;    // tokens.size() - 1
  // canonical tensor name -> gradient, same shape and row-major layout as Model::tensor_f32(name).
  // With tied embeddings the head's gradient is added into model.embed_tokens.weight (there is no lm_head entry).
  std::map<std::string, std::vector<float>> grad;
};

// tokens: at least 2 ids, at most config().max_seq_len. linear_weights_only: only the q, k, v, o, gate, up, down
// weights of every layer get an entry (no embedding, head, norms or biases; skips the [vocab, dim] head gradient).
Gradients loss_and_gradients(const Model& model, const std::vector<int32_t>& tokens, bool linear_weights_only = false);

// Diagonal of the empirical Fisher of every linear weight (q, k, v, o, gate, up, down of every layer; not the
// embedding or head): sum over sequences s of (dLoss_s/dW)^2, Loss_s the mean cross-entropy of sequence s
// (the SqueezeLLM / any-precision sensitivity). Squares are accumulated in fp32 as each layer's gradient is
// produced, so memory holds one copy of the linear weights' size plus the activations of one sequence.
struct FisherDiag {
  std::map<std::string, std::vector<float>> diag;   // canonical weight name -> [out, in], like tensor_f32
  double mean_loss = 0;                              // mean over sequences of Loss_s
  int sequences = 0;
};
FisherDiag fisher_diagonal(const Model& model, const std::vector<std::vector<int32_t>>& sequences,
                           const std::function<void(int done, int total)>& progress = nullptr);

// The canonical names of the linear weights of every layer, in layer order, q k v o gate up down within a layer.
std::vector<std::string> linear_weight_names(const ModelConfig& config);

// Scalar double-precision oracle of the loss above. overrides (may be nullptr): canonical tensor name -> values
// (full tensor, same size as the model's) used in place of the model's weights; lm_head.weight may be overridden
// separately only when the embeddings are not tied.
double loss_reference(const Model& model, const std::vector<int32_t>& tokens,
                      const std::map<std::string, std::vector<double>>* overrides = nullptr);

}  // namespace lowbit
