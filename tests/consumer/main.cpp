// A downstream program: computes a small attention with flashattn on the CPU and checks it
// against a plain loop. Exit status 0 on success.
#include <flashattn/flashattn.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  constexpr int kBatch = 1, kSeqQ = 3, kSeqK = 5, kHeads = 2, kDim = 8;
  constexpr float kTolerance = 1e-5f;
  std::vector<float> q(kBatch * kSeqQ * kHeads * kDim), k(kBatch * kSeqK * kHeads * kDim),
      v(k.size()), out(q.size(), NAN);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * float(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.05f * float(i) + 1.0f);

  using flashattn::DType;
  using flashattn::Tensor;
  flashattn::forward(Tensor::contiguous(q.data(), DType::f32, {kBatch, kSeqQ, kHeads, kDim}),
                     Tensor::contiguous(k.data(), DType::f32, {kBatch, kSeqK, kHeads, kDim}),
                     Tensor::contiguous(v.data(), DType::f32, {kBatch, kSeqK, kHeads, kDim}),
                     Tensor::contiguous(out.data(), DType::f32, {kBatch, kSeqQ, kHeads, kDim}));

  float worst = 0.0f;
  const float scale = 1.0f / std::sqrt(float(kDim));
  for (int i = 0; i < kSeqQ; ++i) {
    for (int h = 0; h < kHeads; ++h) {
      std::vector<float> p(kSeqK);
      float m = -INFINITY, sum = 0.0f;
      for (int j = 0; j < kSeqK; ++j) {
        float s = 0.0f;
        for (int c = 0; c < kDim; ++c) s += q[(i * kHeads + h) * kDim + c] * k[(j * kHeads + h) * kDim + c];
        p[j] = s * scale;
        m = std::fmax(m, p[j]);
      }
      for (float& x : p) sum += (x = std::exp(x - m));
      for (int c = 0; c < kDim; ++c) {
        float o = 0.0f;
        for (int j = 0; j < kSeqK; ++j) o += p[j] * v[(j * kHeads + h) * kDim + c];
        const float diff = std::fabs(o / sum - out[(i * kHeads + h) * kDim + c]);
        worst = std::isnan(diff) ? INFINITY : std::fmax(worst, diff);
      }
    }
  }
  std::printf("%s\nconsumer: max |flashattn - loop| = %g\n", flashattn::build_info().c_str(), worst);
  return worst <= kTolerance ? 0 : 1;
}
