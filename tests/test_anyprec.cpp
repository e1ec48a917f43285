// Any-precision quantization and the "anyprec" bitplane format: k-means, upscaling, prefix property, bitplane
// layout, width selection at run time, corrupt parts, and the end-to-end path on stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "core/half.h"
#include "backend_cuda/anyprec/int8_tables.h"   // host + device arithmetic, no CUDA needed: the GPU's int8 GEMV operands
#include "formats/anyprec/layout.h"
#include "formats/format_table.h"
#include "io/lowbit_file.h"
#include "model/model.h"
#include "quantize/anyprec.h"
#include "quantize/quantize_model.h"
#include "runtime/perplexity.h"
#include "packed_fixtures.h"
#include "test_util.h"

namespace lowbit {
namespace {

// Error budgets.
constexpr double kKMeansMonotoneRelTol = 1e-12;   // Lloyd objective may not rise by more than rounding
constexpr double kFastVsRefRelTol = 2e-5;         // fp32 sgemm vs double accumulation, same weights
constexpr double kMeanRelTol = 1e-3;              // fp16 rounding of a centroid (2^-11 relative) with margin

struct RandomWeights {
  std::vector<float> w, s;
};
RandomWeights random_weights(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> heavy(4.0f);   // LLM weights have heavy tails
  std::exponential_distribution<float> sens(1.0f);
  RandomWeights r;
  for (int64_t i = 0; i < n * k; ++i) {
    r.w.push_back(0.02f * heavy(rng));
    r.s.push_back(sens(rng) * sens(rng));
  }
  return r;
}


TEST(AnyPrecKMeans, ObjectiveNeverRisesAndEndsAtALloydFixedPoint) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t m = trial < 16 ? 1 + trial % 12 : 1 + static_cast<int64_t>(rng() % 700);
    const int K = 1 << (1 + trial % 8);
    std::vector<float> x(static_cast<size_t>(m));
    std::vector<double> w(static_cast<size_t>(m));
    std::student_t_distribution<float> heavy(3.0f);
    std::exponential_distribution<double> e(1.0);
    for (auto& v : x) v = trial % 5 == 0 ? std::round(heavy(rng) * 3) : heavy(rng);   // some rows with ties
    for (auto& v : w) v = e(rng) * e(rng) + 1e-12;
    std::sort(x.begin(), x.end());
    const KMeans1D km = weighted_kmeans_1d(x.data(), w.data(), m, K, 200);
    if (K <= 16) {   // the exact initialisation is the global optimum: Lloyd from quantiles cannot beat it
      const KMeans1D ex = weighted_kmeans_1d(x.data(), w.data(), m, K, 200, true);
      EXPECT_LE(ex.objective.back(), km.objective.back() * (1 + kKMeansMonotoneRelTol)) << "trial " << trial;
      EXPECT_GE(ex.objective.back(), ex.objective.front() * (1 - kKMeansMonotoneRelTol))
          << "Lloyd improved on the global optimum: the partition was not optimal";
      if (m <= 12 && K <= 4) {   // brute force over every contiguous partition
        double best = INFINITY;
        std::vector<int64_t> cut(static_cast<size_t>(K) + 1, 0);
        auto sse = [&](int64_t a, int64_t e) {
          double sw = 0, swx = 0, swxx = 0;
          for (int64_t i = a; i < e; ++i) {
            sw += w[static_cast<size_t>(i)];
            swx += w[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
            swxx += w[static_cast<size_t>(i)] * x[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
          }
          return sw > 0 ? swxx - swx * swx / sw : 0.0;
        };
        auto rec = [&](auto&& self, int j, int64_t from, double acc) -> void {
          if (j == K - 1) {
            best = std::min(best, acc + sse(from, m));
            return;
          }
          for (int64_t e = from; e <= m; ++e) self(self, j + 1, e, acc + sse(from, e));
        };
        rec(rec, 0, 0, 0.0);
        EXPECT_NEAR(ex.objective.front(), best, 1e-9 * (1 + best)) << "trial " << trial;
      }
    }
    ASSERT_EQ(km.start.size(), static_cast<size_t>(K) + 1);
    EXPECT_EQ(km.start.front(), 0);
    EXPECT_EQ(km.start.back(), m);
    for (size_t i = 1; i < km.objective.size(); ++i)
      EXPECT_LE(km.objective[i], km.objective[i - 1] * (1 + kKMeansMonotoneRelTol)) << "trial " << trial << " it " << i;
    ASSERT_LT(km.iterations, 200) << "did not converge";
    // Fixed point: every value is at least as close to its own centroid as to any other.
    for (int j = 0; j < K; ++j)
      for (int64_t i = km.start[static_cast<size_t>(j)]; i < km.start[static_cast<size_t>(j) + 1]; ++i)
        for (int o = 0; o < K; ++o)
          EXPECT_LE(std::fabs(x[static_cast<size_t>(i)] - km.centroids[static_cast<size_t>(j)]),
                    std::fabs(x[static_cast<size_t>(i)] - km.centroids[static_cast<size_t>(o)]) + 1e-9);
    // No empty cluster while the data has enough distinct values.
    const std::set<float> distinct(x.begin(), x.end());
    if (static_cast<int64_t>(distinct.size()) >= K) {
      for (int j = 0; j < K; ++j) EXPECT_LT(km.start[static_cast<size_t>(j)], km.start[static_cast<size_t>(j) + 1]);
    }
  }
}

TEST(AnyPrecQuantize, PrefixPropertyAndUpscalingMatchesStoppingEarly) {
  const int64_t n = 7, k = 300;
  const RandomWeights rw = random_weights(n, k, 3);
  AnyPrecOptions o;
  o.seed_bits = 3;
  o.parent_bits = 8;
  const AnyPrecQuantized parent = anyprec_quantize(rw.w.data(), rw.s.data(), n, k, o);
  for (int b = 3; b <= 8; ++b) {
    // A run that stops upscaling at b must give exactly the parent's top b bits and the same LUT: later splits
    // never move a weight to another b-bit cluster.
    AnyPrecOptions ob = o;
    ob.parent_bits = b;
    const AnyPrecQuantized q = anyprec_quantize(rw.w.data(), rw.s.data(), n, k, ob);
    for (int64_t i = 0; i < n * k; ++i)
      ASSERT_EQ(q.codes[static_cast<size_t>(i)], parent.codes[static_cast<size_t>(i)] >> (8 - b)) << b << " bits, weight " << i;
    EXPECT_EQ(q.luts.at(b), parent.luts.at(b)) << b;
  }
}

TEST(AnyPrecQuantize, LutsAreWeightedMeansAndSplitsAreOptimal2Means) {
  const int64_t n = 5, k = 257;
  const RandomWeights rw = random_weights(n, k, 11);
  AnyPrecOptions o;
  o.seed_bits = 2;
  o.parent_bits = 6;
  const AnyPrecQuantized q = anyprec_quantize(rw.w.data(), rw.s.data(), n, k, o);
  for (int64_t r = 0; r < n; ++r) {
    for (int b = o.seed_bits; b <= o.parent_bits; ++b) {
      // Members of each b-bit cluster, sorted by value.
      std::vector<std::vector<std::pair<float, double>>> members(static_cast<size_t>(1) << b);
      for (int64_t c = 0; c < k; ++c)
        members[static_cast<size_t>(q.codes[static_cast<size_t>(r * k + c)] >> (o.parent_bits - b))].push_back(
            {rw.w[static_cast<size_t>(r * k + c)], rw.s[static_cast<size_t>(r * k + c)]});
      for (size_t j = 0; j < members.size(); ++j) {
        auto& mj = members[j];
        std::sort(mj.begin(), mj.end());
        if (mj.empty()) continue;
        const float lut = f16_to_f32(q.luts.at(b)[static_cast<size_t>((r << b) + static_cast<int64_t>(j))]);
        if (b > o.seed_bits) {   // upscaled levels: fp16 of the members' weighted mean
          double sw = 0, swx = 0;
          for (auto& [x, s] : mj) {
            sw += s;
            swx += s * x;
          }
          EXPECT_NEAR(lut, swx / sw, kMeanRelTol * std::fabs(swx / sw) + 1e-7) << "row " << r << " width " << b;
        }
        if (b < o.parent_bits) {   // the split into the two children is the best cut of the sorted members
          auto sse = [&](size_t a, size_t e) {
            double sw = 0, swx = 0, swxx = 0;
            for (size_t i = a; i < e; ++i) {
              sw += mj[i].second;
              swx += mj[i].second * mj[i].first;
              swxx += mj[i].second * mj[i].first * mj[i].first;
            }
            return sw > 0 ? swxx - swx * swx / sw : 0.0;
          };
          size_t left = 0;
          for (int64_t c = 0; c < k; ++c)
            if (static_cast<size_t>(q.codes[static_cast<size_t>(r * k + c)] >> (o.parent_bits - b)) == j &&
                ((q.codes[static_cast<size_t>(r * k + c)] >> (o.parent_bits - b - 1)) & 1) == 0)
              ++left;
          double best = INFINITY;
          for (size_t p = 0; p <= mj.size(); ++p) best = std::min(best, sse(0, p) + sse(p, mj.size()));
          EXPECT_LE(sse(0, left) + sse(left, mj.size()), best + 1e-12 * (1 + std::fabs(best)))
              << "row " << r << " width " << b << " cluster " << j;
        }
      }
    }
  }
}

TEST(AnyPrecQuantize, OutliersAreExactAndSharedByAllWidths) {
  const int64_t n = 6, k = 200;
  const RandomWeights rw = random_weights(n, k, 5);
  AnyPrecOptions o;
  o.outlier_fraction = 0.01;
  const AnyPrecQuantized q = anyprec_quantize(rw.w.data(), rw.s.data(), n, k, o);
  ASSERT_EQ(q.nnz(), 12);
  // They are the 12 largest sensitivities.
  std::vector<float> sorted = rw.s;
  std::sort(sorted.rbegin(), sorted.rend());
  for (int64_t r = 0; r < n; ++r)
    for (int32_t i = q.outlier_rowptr[static_cast<size_t>(r)]; i < q.outlier_rowptr[static_cast<size_t>(r + 1)]; ++i) {
      const int64_t c = q.outlier_col[static_cast<size_t>(i)];
      EXPECT_GE(rw.s[static_cast<size_t>(r * k + c)], sorted[11]);
      for (int b = 3; b <= 8; ++b)
        EXPECT_EQ(q.value(r, c, b), f16_to_f32(f32_to_f16(rw.w[static_cast<size_t>(r * k + c)])));
    }
  // Keeping them exact lowers the weighted error at every width.
  AnyPrecOptions plain;
  const AnyPrecQuantized p = anyprec_quantize(rw.w.data(), rw.s.data(), n, k, plain);
  for (int b = 3; b <= 8; ++b)
    EXPECT_LT(anyprec_weighted_error(rw.w.data(), rw.s.data(), q, b), anyprec_weighted_error(rw.w.data(), rw.s.data(), p, b));
  // The weighted error is its definition, bit for bit: Σ_r (Σ_c s (w - value(r, c, b))²), rows summed in order.
  for (const AnyPrecQuantized* z : {&q, &p})
    for (int b = 3; b <= 8; ++b) {
      double want = 0;
      for (int64_t r = 0; r < n; ++r) {
        double e = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double d = static_cast<double>(rw.w[static_cast<size_t>(r * k + c)]) - z->value(r, c, b);
          e += rw.s[static_cast<size_t>(r * k + c)] * d * d;
        }
        want += e;
      }
      EXPECT_EQ(anyprec_weighted_error(rw.w.data(), rw.s.data(), *z, b), want) << b;
    }
}

TEST(AnyPrecQuantize, ErrorFallsWithEveryWidthAndSensitivityIsHonoured) {
  const int64_t n = 8, k = 512;
  const RandomWeights rw = random_weights(n, k, 9);
  const AnyPrecQuantized q = anyprec_quantize(rw.w.data(), rw.s.data(), n, k, AnyPrecOptions{});
  double prev = INFINITY;
  for (int b = 3; b <= 8; ++b) {
    const double e = anyprec_weighted_error(rw.w.data(), rw.s.data(), q, b);
    EXPECT_LT(e, prev) << b;
    prev = e;
  }
  // Clustering with uniform sensitivity does worse on the sensitivity-weighted objective.
  const std::vector<float> ones(rw.s.size(), 1.0f);
  const AnyPrecQuantized u = anyprec_quantize(rw.w.data(), ones.data(), n, k, AnyPrecOptions{});
  EXPECT_LT(anyprec_weighted_error(rw.w.data(), rw.s.data(), q, 3), anyprec_weighted_error(rw.w.data(), rw.s.data(), u, 3));
}

TEST(AnyPrecLayout, SlotsAreABijectionAndTilesMatchTheDrawing) {
  for (int64_t k : {1, 31, 32, 33, 100, 1000, 1024, 1025, 2080, 3000, 4096}) {
    const int64_t W = anyprec_words_per_row(k);
    std::set<std::pair<int64_t, int>> seen;
    for (int64_t c = 0; c < 32 * W; ++c) {
      const PlaneSlot s = anyprec_slot(c, W);
      ASSERT_GE(s.word, 0);
      ASSERT_LT(s.word, W);
      ASSERT_TRUE(s.bit >= 0 && s.bit < 32);
      ASSERT_TRUE(seen.insert({s.word, s.bit}).second) << "k " << k << " column " << c;
    }
  }
  // A full tile: lane t's word holds columns 8t..8t+7 of each 256-column quarter, byte u for quarter u.
  const PlaneSlot a = anyprec_slot(8 * 5 + 3, 64), b = anyprec_slot(256 * 2 + 8 * 5 + 3, 64), c = anyprec_slot(1024 + 7, 64);
  EXPECT_EQ(a.word, 5);
  EXPECT_EQ(a.bit, 3);
  EXPECT_EQ(b.word, 5);
  EXPECT_EQ(b.bit, 16 + 3);
  EXPECT_EQ(c.word, 32);
  EXPECT_EQ(c.bit, 7);
}

TEST(AnyPrecPack, RoundTripIsBitExactForOddShapes) {
  uint32_t seed = 1;
  for (int64_t k : {1, 7, 31, 33, 100, 1023, 1025, 2081}) {
    for (int planes : {2, 3, 5, 8}) {
      const uint32_t widths = (1u << planes) | (planes > 2 ? 1u << 2 : 0u);
      const AnyPrecQuantized q = test::random_codes(3, k, planes, widths, seed++);
      std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
      const PackedWeight w = pack_anyprec(q, storage);
      EXPECT_EQ(w.parts.at("planes").shape, (std::vector<int64_t>{planes, 3, (k + 31) / 32}));
      const AnyPrecQuantized u = unpack_anyprec(w, "t");
      EXPECT_EQ(u.codes, q.codes) << "k " << k << " planes " << planes;
      EXPECT_EQ(u.luts, q.luts);
      EXPECT_EQ(packed_stored_bits(w, "t"), 8 * (planes * 3 * 4 * ((k + 31) / 32)) + 16ull * 3 * ((1 << planes) + (planes > 2 ? 4 : 0)));
    }
  }
}

TEST(AnyPrecLinear, ReadsOnlyItsPlanesAndMatchesTheReference) {
  const int64_t n = 37, k = 1100;
  const RandomWeights rw = random_weights(n, k, 21);
  AnyPrecOptions o;
  o.seed_bits = 2;
  o.outlier_fraction = 0.003;
  const AnyPrecQuantized q = anyprec_quantize(rw.w.data(), rw.s.data(), n, k, o);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  const PackedWeight w = pack_anyprec(q, storage);
  std::vector<float> bias(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) bias[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i);
  const auto op = make_packed_linear(w, bias.data(), "t");
  EXPECT_EQ(op->served_widths(), 0x1fcu);
  for (int b = 2; b <= 8; ++b) EXPECT_EQ(8 * op->weight_bytes(b), anyprec_view_bits(w, b)) << b;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  for (int64_t m : {1, 5}) {
    std::vector<float> x(static_cast<size_t>(m * k));
    for (auto& v : x) v = nd(rng);
    for (int b = 2; b <= 8; ++b) {
      std::vector<float> y(static_cast<size_t>(m * n)), yr(y.size()), yd(y.size()), deq(static_cast<size_t>(n * k));
      op->forward(x.data(), m, y.data(), b);
      op->forward_ref(x.data(), m, yr.data(), b);
      q.dequantize(b, deq.data());
      DenseLinear(deq.data(), bias.data(), n, k).forward_ref(x.data(), m, yd.data());
      for (size_t i = 0; i < y.size(); ++i) {
        EXPECT_NEAR(y[i], yr[i], kFastVsRefRelTol * (1 + std::fabs(yr[i]))) << "m " << m << " b " << b;
        EXPECT_NEAR(yd[i], yr[i], 1e-6 * (1 + std::fabs(yr[i]))) << "m " << m << " b " << b;
      }
      // Scramble every plane past b: the b-bit result must not change by a single bit.
      auto& planes = *storage.front();
      const std::vector<uint8_t> saved = planes;
      const size_t plane_bytes = static_cast<size_t>(n * anyprec_words_per_row(k) * 4);
      for (size_t i = static_cast<size_t>(b) * plane_bytes; i < planes.size(); ++i) planes[i] ^= static_cast<uint8_t>(rng());
      std::vector<float> y2(y.size());
      op->forward(x.data(), m, y2.data(), b);
      EXPECT_EQ(y2, y) << "width " << b << " read a plane it does not need";
      if (b < 8) {
        op->forward(x.data(), m, y2.data(), 8);
        std::vector<float> y8(y.size());
        planes = saved;
        op->forward(x.data(), m, y8.data(), 8);
        EXPECT_NE(y2, y8) << "scrambling planes " << b << "..7 should change the 8-bit view";
      }
      planes = saved;
    }
  }
  EXPECT_THROW(op->forward(nullptr, 1, nullptr, 9), Error);
  EXPECT_THROW(op->forward(nullptr, 1, nullptr, 1), Error);
}

// Corrupt parts: each gets a one-line error naming the problem.
TEST(AnyPrecCorrupt, ReadersRefuseBadParts) {
  const AnyPrecQuantized q = test::random_codes(4, 40, 4, (1u << 3) | (1u << 4), 3);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  auto fresh = [&] { return pack_anyprec(q, storage); };
  const auto expect = test::expect_packed_refused;
  {
    PackedWeight w = fresh();
    w.params["widths"] = 1 << 3 | 1 << 4 | 1 << 5;
    expect(w, "missing part lut5");   // a width past the planes needs a LUT the file lacks
  }
  {
    PackedWeight w = fresh();
    w.params["widths"] = 1 << 3;
    w.parts.erase("lut4");
    expect(w, "the widest served width must equal planes");
  }
  {
    PackedWeight w = fresh();
    w.parts.erase("lut3");
    expect(w, "missing part lut3");
  }
  {
    PackedWeight w = fresh();
    auto buf = std::make_shared<std::vector<uint8_t>>(w.parts["planes"].data, w.parts["planes"].data + w.parts["planes"].nbytes);
    (*buf)[4 * 1 + 3] |= 0x80;   // word 1 of plane 0 row 0: columns >= 40 are padding
    storage.push_back(buf);
    w.parts["planes"].data = buf->data();
    expect(w, "non-zero padding bits");
  }
  {
    PackedWeight w = fresh();
    auto buf = std::make_shared<std::vector<uint8_t>>(w.parts["lut3"].data, w.parts["lut3"].data + w.parts["lut3"].nbytes);
    (*buf)[1] = 0x7c;   // entry 0 = +inf
    (*buf)[0] = 0x00;
    storage.push_back(buf);
    w.parts["lut3"].data = buf->data();
    expect(w, "part lut3 [0, 0] is not finite");
  }
  // Outliers: rowptr, column range and order.
  AnyPrecQuantized s = q;
  s.outlier_rowptr = {0, 1, 1, 2, 2};
  s.outlier_col = {5, 39};
  s.outlier_val = {f32_to_f16(1.0f), f32_to_f16(-1.0f)};
  const PackedWeight good = pack_anyprec(s, storage);
  auto with_i32 = [&](const std::string& part, int64_t index, int32_t value) {
    PackedWeight w = good;
    auto buf = std::make_shared<std::vector<uint8_t>>(w.parts[part].data, w.parts[part].data + w.parts[part].nbytes);
    std::memcpy(buf->data() + index * 4, &value, 4);
    storage.push_back(buf);
    w.parts[part].data = buf->data();
    return w;
  };
  expect(with_i32("outlier_col", 1, 40), "outlier_col [1] = 40 is outside [0, k)");
  expect(with_i32("outlier_rowptr", 2, 0), "outlier_rowptr [2] = 0 is below the previous entry");
  expect(with_i32("outlier_rowptr", 4, 1), "must start at 0 and end at nnz");
  {
    PackedWeight w = good;
    w.params["nnz"] = 3;
    expect(w, "part outlier_col has shape [2]");
  }
  {
    PackedWeight w = good;
    w.params["sparse"] = 0;
    expect(w, "must be absent");
  }
}

TEST(FormatTable, DeclaresAnyPrec) {
  const PackedFormat* f = &packed_format(FormatId::AnyPrec);
  ASSERT_NE(f, nullptr);
  std::vector<std::string> parts;
  for (const PackedPart& p : f->parts) parts.emplace_back(p.name);
  EXPECT_EQ(parts, (std::vector<std::string>{"planes", "lut2", "lut3", "lut4", "lut5", "lut6", "lut7", "lut8",
                                             "outlier_rowptr", "outlier_col", "outlier_val"}));
}

// End to end on a real model: quantize, write, load once, evaluate every width through the same Model object.
TEST(AnyPrecModel, Stories260KServesEveryWidthFromOneFile) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "TinyStories sample");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  const std::string dir = test::temp_dir();
  auto model = Model::load(bin);
  QuantizeOptions o;
  o.method = QuantMethod::AnyPrec;
  o.calib.samples = 16;
  o.calib.seqlen = 256;
  o.anyprec.outlier_fraction = 0.002;
  const QuantizeReport rep = quantize_to_file(*model, o, dir + "/ap.lowbit");
  EXPECT_EQ(rep.width_avg_bits.size(), 6u);
  for (int b = 4; b <= 8; ++b) EXPECT_LT(rep.width_weighted_error.at(b), rep.width_weighted_error.at(b - 1));

  const auto base = Model::load(bin);
  const auto ap = Model::load(dir + "/ap.lowbit");
  EXPECT_EQ(ap->widths(), (std::vector<int>{3, 4, 5, 6, 7, 8}));
  const auto windows = make_windows_documents(test::tinystories_docs(*ap), 512, nullptr);
  PplOptions po;
  po.ctx = 512;
  const double ppl_base = perplexity(*base, windows, po).ppl;
  std::map<int, double> ppl;
  for (int b : {8, 3, 5, 4, 6, 7}) {   // any order, one loaded model
    po.bits = b;
    ppl[b] = perplexity(*ap, windows, po).ppl;
    std::printf("[ stories260K anyprec seed 3 ] width %d ppl %.4f (baseline %.4f)\n", b, ppl[b], ppl_base);
  }
  EXPECT_LT(std::fabs(ppl[8] / ppl_base - 1), 0.003);   // TARGETS: 8-bit within 0.3% of baseline
  EXPECT_GT(ppl[3], ppl[4]);
  EXPECT_GT(ppl[4], ppl[6]);
  po.bits = 0;   // 0 = the widest
  EXPECT_DOUBLE_EQ(perplexity(*ap, windows, po).ppl, ppl[8]);
  // Reference path agrees with the fast path at a low width.
  po.bits = 3;
  po.reference_path = true;
  po.max_windows = 1;
  const double ref3 = perplexity(*ap, windows, po).ppl;
  po.reference_path = false;
  EXPECT_NEAR(perplexity(*ap, windows, po).ppl, ref3, 1e-4 * ref3);
  // Widths the file lacks, and --bits on a single-precision model, are refused.
  test::expect_error([&](const std::string&) { ap->check_bits(2); }, dir + "/ap.lowbit", "not a width this model serves (3,4,5,6,7,8)");
  test::expect_error([&](const std::string&) { base->check_bits(4); }, bin, "needs an any-precision model");
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

TEST(AnyPrecCli, QuantizeIsDeterministicCachesSensitivityAndRefusesMisuse) {
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  const std::string dir = test::temp_dir();
  const std::string base = "quantize " + bin + " --method anyprec --calib-samples 4 --calib-seqlen 128 --outliers 0.001 "
                           "--sensitivity-cache " + dir + "/fisher.st";
  std::string out;
  ASSERT_EQ(test::run_cli(base + " -o " + dir + "/a.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("mean calibration loss"), std::string::npos) << out;
  ASSERT_EQ(test::run_cli(base + " -o " + dir + "/b.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("read from " + dir + "/fisher.st"), std::string::npos) << out;
  EXPECT_EQ(test::read_file(dir + "/a.lowbit"), test::read_file(dir + "/b.lowbit")) << "same inputs, different file";

  ASSERT_EQ(test::run_cli("inspect " + dir + "/a.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("any-precision widths"), std::string::npos) << out;
  EXPECT_NE(out.find("separate models, one per width"), std::string::npos) << out;
  ASSERT_EQ(test::run_cli("generate " + dir + "/a.lowbit -p \"Once upon a time\" -n 8 --bits 4 --no-stats", &out), 0) << out;

  // Misuse: one line on stderr, non-zero exit, no output file.
  test::expect_cli_refuses({
      {"quantize " + bin + " --method anyprec --calib-samples 5 --calib-seqlen 128 --sensitivity-cache " + dir +
           "/fisher.st -o " + dir + "/c.lowbit",
       "sensitivity cache was made with calib_samples = 4"},
      {"quantize " + bin + " --method anyprec --widths 3,5 -o " + dir + "/c.lowbit", "must include the parent width 8"},
      {"quantize " + bin + " --method anyprec --seed-bits 4 --parent-bits 3 -o " + dir + "/c.lowbit", "--parent-bits must be in 4..8"},
      {"ppl " + dir + "/a.lowbit --text " + bin + " --bits 2", "not a width this model serves (3,4,5,6,7,8)"},
      {"generate " + bin + " -p hi --bits 4", "needs an any-precision model"},
  }, dir + "/c.lowbit");
}

}  // namespace
}  // namespace lowbit

// Why the GEMVs accumulate in fp32: the paper's kernel accumulates in fp16 (HFMA2); ours in fp32. Emulated on
// the CPU in the GEMV's own order (32 lanes over strided columns, then a butterfly reduction), against a double
// reference, on Llama-shaped row lengths with fp16 centroid values and activations that carry outlier channels.
TEST(AnyPrecAccumulation, Fp32StaysExactWhereFp16AccumulationDrifts) {
  auto to_h = [](float v) { return lowbit::f16_to_f32(lowbit::f32_to_f16(v)); };
  std::mt19937 rng(7);
  std::normal_distribution<float> wd(0.0f, 0.02f), xd(0.0f, 1.0f);
  for (const int k : {4096, 11008, 28672}) {
    const int rows = 64;
    std::vector<float> x(static_cast<size_t>(k));
    for (int c = 0; c < k; ++c) x[static_cast<size_t>(c)] = to_h(xd(rng) * (c % 97 == 0 ? 20.0f : 1.0f));
    double num32 = 0, num16 = 0, den = 0;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> w(static_cast<size_t>(k));
      for (auto& v : w) v = to_h(wd(rng));   // LUT values are stored in fp16
      double exact = 0;
      float lane32[32] = {}, lane16[32] = {};
      for (int c = 0; c < k; ++c) {
        const float p = w[static_cast<size_t>(c)], q = x[static_cast<size_t>(c)];
        exact += static_cast<double>(p) * q;
        lane32[c % 32] = std::fma(p, q, lane32[c % 32]);
        lane16[c % 32] = to_h(std::fma(p, q, lane16[c % 32]));   // HFMA: one rounding to fp16 per step
      }
      for (int off = 16; off > 0; off >>= 1)
        for (int l = 0; l < off; ++l) {
          lane32[l] += lane32[l + off];
          lane16[l] = to_h(lane16[l] + lane16[l + off]);
        }
      num32 += (lane32[0] - exact) * (lane32[0] - exact);
      num16 += (lane16[0] - exact) * (lane16[0] - exact);
      den += exact * exact;
    }
    const double e32 = std::sqrt(num32 / den), e16 = std::sqrt(num16 / den);
    std::printf("[ accumulation k=%d ] relative error of the row sums: fp32 %.2e, fp16 %.2e (%.0fx)\n", k, e32, e16, e16 / e32);
    EXPECT_LT(e32, 4e-6) << "k=" << k;          // fp32 accumulation: at the level of fp32 rounding
    EXPECT_GT(e16, 1e-4) << "k=" << k;          // fp16 accumulation: visible error on long rows
    EXPECT_GT(e16, 100 * e32) << "k=" << k;
  }
}

namespace lowbit {
namespace {

// The int8 forms of the GPU's int8 GEMV (int8_tables.h, shared by the kernels and their CPU twin), against their
// named budgets on every table width the GEMV serves (2..4 bits: 4, 8, 16 centroids per row) and on activations:
//   - a centroid becomes sigma * q with |sigma * q - c| <= sigma / 2 = max|c| / 254, |q| <= 127, the row's largest
//     magnitude exactly +-127 (the whole int8 range used);
//   - an activation becomes s (hi + lo / 254) within s / 508 = max|x| / 64516;
//   - zero rows / columns give scale 0 and zeros; a NaN makes the scale NaN (outputs NaN, never finite garbage).
TEST(AnyPrecInt8Tables, RoundingStaysWithinItsBudgetAtEveryWidth) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int bits = 2; bits <= 4; ++bits) {
    const int E = 1 << bits;
    double worst = 0;
    for (int row = 0; row < 2000; ++row) {
      std::vector<float> c(static_cast<size_t>(E));
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 14);   // rows from 2^-14 to 2^5
      for (float& v : c) v = f16_to_f32(f32_to_f16(scale * nd(rng)));           // fp16 centroids, as stored
      std::vector<int8_t> q(static_cast<size_t>(E));
      const float sigma = cuda::i8_table_row(c.data(), E, q.data());
      float mx = 0;
      int qmax = 0;
      for (float v : c) mx = std::max(mx, std::fabs(v));
      for (int e = 0; e < E; ++e) {
        qmax = std::max(qmax, std::abs(static_cast<int>(q[static_cast<size_t>(e)])));
        const double err = std::fabs(static_cast<double>(sigma) * q[static_cast<size_t>(e)] - c[static_cast<size_t>(e)]);
        // sigma / 2, plus the fp32 rounding of c / sigma (|c / sigma| <= 127: 127 * 2^-24 < 1e-5 steps)
        ASSERT_LE(err, sigma * (0.5 + 1e-5)) << bits << " bits, row " << row << " entry " << e;
        worst = std::max(worst, err / mx);
      }
      EXPECT_EQ(qmax, 127) << bits << " bits, row " << row;
      EXPECT_FLOAT_EQ(sigma, mx / 127.0f);
    }
    EXPECT_LE(worst, (0.5 + 1e-5) / 127) << bits << " bits";
    EXPECT_GT(worst, 1.0 / 254 * 0.9) << bits << " bits: the budget is reached, the test can see a wrong rounding";
  }
  std::vector<int8_t> q(8, 5);
  const std::vector<float> zeros(8, 0.0f);
  EXPECT_EQ(cuda::i8_table_row(zeros.data(), 8, q.data()), 0.0f);
  for (int8_t v : q) EXPECT_EQ(v, 0);
  std::vector<float> nan_row(8, 1.0f);
  nan_row[3] = std::nanf("");
  EXPECT_TRUE(std::isnan(cuda::i8_table_row(nan_row.data(), 8, q.data())));
  // Activations: two int8 pieces under the column scale.
  for (int col = 0; col < 200; ++col) {
    std::vector<float> x(4096);
    for (float& v : x) v = nd(rng) * (rng() % 50 == 0 ? 100.0f : 1.0f);   // outlier channels
    float mx = 0;
    for (float v : x) mx = cuda::i8_absmax_step(mx, v);
    const float s = mx / cuda::kI8Max;
    for (float v : x) {
      int8_t hi, lo;
      cuda::i8_x_pieces(v, s, hi, lo);
      ASSERT_LE(std::abs(static_cast<int>(hi)), 127);
      ASSERT_LE(std::abs(static_cast<int>(lo)), 127);
      const double got = static_cast<double>(s) * (hi + lo / 254.0);
      ASSERT_LE(std::fabs(got - v), s / 508.0 * (1 + 1e-4) + 1e-7 * std::fabs(v)) << "x " << v << " scale " << s;
    }
  }
  // Two pieces per centroid (the 4-bit tables): sigma = max|c| / 126, within sigma / 508 = max|c| / 64008, both pieces in
  // -127..126 (i8_split16's precondition); rows of centroids at half steps reach lo = 127 before its fold.
  int folded = 0;
  for (int row = 0; row < 4000; ++row) {
    std::vector<float> c(16);
    for (float& v : c) v = f16_to_f32(f32_to_f16(0.01f * nd(rng)));
    if (row % 2 == 1) {   // centroids a hair below (k + 1/2) sigma: the residual rounds to lo = 127
      float mx = 0;
      for (float v : c) mx = std::max(mx, std::fabs(v));
      for (int e = 0; e < 15; ++e) c[static_cast<size_t>(e)] = (static_cast<float>(static_cast<int>(rng() % 200) - 100) + 0.4995f) * (mx / 126.0f);
      c[15] = mx;   // the row's maximum, so sigma is mx / 126
    }
    std::vector<int8_t> q2(16), l2(16);
    const float sigma = cuda::i8_table_row2(c.data(), 16, q2.data(), l2.data());
    float mx = 0;
    for (float v : c) mx = std::max(mx, std::fabs(v));
    EXPECT_FLOAT_EQ(sigma, mx / 126.0f);
    for (int e = 0; e < 16; ++e) {
      const int qe = q2[static_cast<size_t>(e)], le = l2[static_cast<size_t>(e)];
      ASSERT_TRUE(qe >= -127 && qe <= 126 && le >= -127 && le <= 126) << "row " << row << " entry " << e << ": " << qe << ", " << le;
      folded += le == -127;
      const double got = static_cast<double>(sigma) * (qe + le / 254.0);
      ASSERT_LE(std::fabs(got - c[static_cast<size_t>(e)]), sigma * (1.0 / 508 + 1e-5)) << "row " << row << " entry " << e;
    }
  }
  EXPECT_GT(folded, 100) << "the lo = 127 fold was exercised";
  int8_t hi = 1, lo = 1;
  cuda::i8_x_pieces(3.0f, 0.0f, hi, lo);
  EXPECT_EQ(hi, 0);
  EXPECT_EQ(lo, 0);
  EXPECT_TRUE(std::isnan(cuda::i8_absmax_step(1.0f, std::nanf(""))));
}

// The 4-bit GEMV's two-PRMT form of a 16-entry table (int8_tables.h, i8_split16): for every pair of values in the range
// i8_table_row2 gives, the two lookups as the hardware makes them (PRMT's generic mode: a selector nibble's msb
// replicates the selected byte's sign bit) sum to the value, for all 16 codes.
uint32_t prmt_generic(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int q = 0; q < 4; ++q) {
    const uint32_t n = (sel >> (4 * q)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(v >> (8 * (n & 7u))) & 0xFFu;
    if (n & 8u) byte = (byte & 0x80u) != 0 ? 0xFFu : 0u;
    d |= byte << (8 * q);
  }
  return d;
}
TEST(AnyPrecInt8Tables, SplitFormSumsToEveryValue) {
  std::mt19937 rng(11);
  int8_t t[16], s[16];
  for (int a = -127; a <= 126; ++a)
    for (int b = -127; b <= 126; ++b) {
      for (int e = 0; e < 16; ++e) t[e] = static_cast<int8_t>(static_cast<int>(rng() % 254) - 127);
      const int i = static_cast<int>(rng() % 8);
      t[i] = static_cast<int8_t>(a);
      t[i + 8] = static_cast<int8_t>(b);
      cuda::i8_split16(t, s);
      uint32_t w[4];
      std::memcpy(w, s, 16);
      for (int c = 0; c < 16; ++c) {
        const uint32_t sel = static_cast<uint32_t>(c) * 0x1111u;   // code c in all four nibbles
        const int a1 = static_cast<int8_t>(prmt_generic(w[0], w[1], sel) & 0xFFu);
        const int a2 = static_cast<int8_t>(prmt_generic(w[2], w[3], sel ^ 0x8888u) & 0xFFu);
        ASSERT_EQ(a1 + a2, t[c]) << "pair (" << a << ", " << b << ") at " << i << ", code " << c;
        ASSERT_EQ(cuda::i8_split16_at(s, c), t[c]);
      }
    }
}

}  // namespace
}  // namespace lowbit
