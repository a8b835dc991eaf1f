// Sparse results into dense tensors (top-k's decompress) and momentum correction's step:
// see the declarations in dlcomm_native.h for the numpy each one equals.
#include <vector>

#include "dlcomm_native.h"

namespace {

template <class T, class I>
int64_t scatter_add(T* out, int64_t n, const T* values, const I* indices, int64_t k) {
  // numpy's out[indices] += values: every sum is read before any write, so a repeated
  // index keeps the last of its sums. Indices are checked first: nothing is written when one
  // is outside [0, n) (the caller then lets numpy wrap negatives or raise).
  for (int64_t j = 0; j < k; ++j) {
    if (indices[j] < 0 || int64_t(indices[j]) >= n) return -1;
  }
  std::vector<T> sums(size_t(k > 0 ? k : 0));
  for (int64_t j = 0; j < k; ++j) sums[size_t(j)] = out[indices[j]] + values[j];
  for (int64_t j = 0; j < k; ++j) out[indices[j]] = sums[size_t(j)];
  return 0;
}

template <class T>
int64_t scatter_add_any_index(T* out, int64_t n, const T* values, const void* indices,
                              int index_bytes, int64_t k) {
  if (index_bytes == 4)
    return scatter_add(out, n, values, static_cast<const int32_t*>(indices), k);
  return scatter_add(out, n, values, static_cast<const int64_t*>(indices), k);
}

template <class T>
void velocity_step(T* result, T* kept, int64_t n, T scale) {
  dlc::chunked(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T r = result[i];
      const T scaled = kept[i] * scale;  // rounded on its own: no fused multiply-add
      result[i] = scaled + r;
      kept[i] = r;
    }
  });
}

}  // namespace

extern "C" {

int64_t dlc_scatter_add_f32(float* out, int64_t n, const float* values, const void* indices,
                            int index_bytes, int64_t k) {
  return scatter_add_any_index(out, n, values, indices, index_bytes, k);
}
int64_t dlc_scatter_add_f64(double* out, int64_t n, const double* values, const void* indices,
                            int index_bytes, int64_t k) {
  return scatter_add_any_index(out, n, values, indices, index_bytes, k);
}
void dlc_velocity_step_f32(float* result, float* kept, int64_t n, float scale) {
  velocity_step(result, kept, n, scale);
}
void dlc_velocity_step_f64(double* result, double* kept, int64_t n, double scale) {
  velocity_step(result, kept, n, scale);
}

}  // extern "C"
