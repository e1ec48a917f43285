// lowbit_example MODEL [BITS]: opens a model (or .lowbit file) through the public API, prints its widths, streams a
// short greedy continuation through a token callback and scores a tiny perplexity. Exits non-zero on any failure.
#include <lowbit/lowbit.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [BITS]\n", argv[0]);
    return 2;
  }
  try {
    lowbit::api::Model model = lowbit::api::Model::open(argv[1]);   // Device::Auto: the GPU when present
    const lowbit::api::ModelInfo& info = model.info();
    std::printf("model: %s (%s, %d layers, dim %d) on %s\n", info.path.c_str(), lowbit::api::format_name(info.format),
                info.n_layers, info.dim, model.device_name().c_str());
    std::printf("widths:");
    if (model.widths().empty()) std::printf(" (single precision)");
    for (int b : model.widths()) std::printf(" %d", b);
    std::printf("\n");

    lowbit::api::GenerateParams g;
    g.max_tokens = 16;
    g.bits = argc > 2 ? std::atoi(argv[2]) : 0;
    int pieces = 0;
    const std::string prompt = "Once upon a time";
    std::printf("generate: %s", prompt.c_str());
    const lowbit::api::GenerateResult r = model.generate(prompt, g, [&](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      ++pieces;
    });
    std::printf("\n  %zu tokens (%d callbacks), stop: %s, %.1f tokens/s\n", r.new_ids.size(), pieces,
                lowbit::api::stop_reason_name(r.stop_reason), r.decode_tokens_per_s());

    lowbit::api::PplParams p;
    p.ctx = 32;
    p.bits = g.bits;
    const lowbit::api::EvalWindows w = model.eval_windows_from_text(
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, "
        "she saw a big red ball in the park. She ran to the ball and kicked it as far as she could.",
        p);
    const lowbit::api::PplResult s = model.perplexity(w, p);
    std::printf("perplexity: %.4f over %lld predicted tokens (%d windows of %d)\n", s.perplexity,
                static_cast<long long>(s.predicted_tokens), s.windows, w.ctx);

    try {   // every bad input is a lowbit::Error with a one-line message
      model.check_bits(1);
    } catch (const lowbit::Error& e) {
      std::printf("bad width refused: %s\n", e.what());
    }
    const bool ok = pieces == static_cast<int>(r.new_ids.size()) && pieces > 0 && std::isfinite(s.perplexity) &&
                    s.perplexity > 1.0 && s.predicted_tokens > 0;
    std::printf("example: %s\n", ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
  } catch (const lowbit::Error& e) {
    std::fprintf(stderr, "lowbit_example: error: %s\n", e.what());
    return 1;
  }
}
