// Threshold selection fused with error feedback: one pass over grad (+ residual) yields the
// selected (values, indices) and the new residual, replacing numpy's abs, compare, nonzero,
// gather, zeros, scatter and subtract passes (dlcomm/compression/error_feedback.py +
// topk_select.py). Each thread writes its picks at its own chunk's offset in the output
// buffers; one serial memmove per thread then closes the gaps (the picks are few).
#include <math.h>

#include <vector>

#include "dlcomm_native.h"

namespace {

template <class T, bool kHasResidual>
int64_t count_range(const T* g, const T* r, int64_t lo, int64_t hi, T threshold) {
  int64_t count = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const T acc = kHasResidual ? T(g[i] + r[i]) : g[i];
    count += fabs(acc) >= threshold;
  }
  return count;
}

template <class T>
int64_t count_above(const T* g, const T* r, int64_t n, T threshold) {
  const int threads = dlc::threads_for(n);
  int64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static) if (threads > 1)
  for (int64_t b = 0; b < (n + 4095) / 4096; ++b) {
    const int64_t lo = b * 4096, hi = lo + 4096 < n ? lo + 4096 : n;
    total += r ? count_range<T, true>(g, r, lo, hi, threshold)
               : count_range<T, false>(g, r, lo, hi, threshold);
  }
  return total;
}

template <class T, bool kHasResidual>
int64_t momentum_count_range(T* v, const T* g, T m, const T* r, int64_t lo, int64_t hi,
                             T threshold) {
  int64_t count = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const T scaled = v[i] * m;  // numpy's v *= m; v += g: two roundings
    const T u = scaled + g[i];
    v[i] = u;
    const T acc = kHasResidual ? T(u + r[i]) : u;
    count += fabs(acc) >= threshold;
  }
  return count;
}

template <class T>
int64_t momentum_count_above(T* v, const T* g, T m, const T* r, int64_t n, T threshold) {
  const int threads = dlc::threads_for(n);
  int64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static) if (threads > 1)
  for (int64_t b = 0; b < (n + 4095) / 4096; ++b) {
    const int64_t lo = b * 4096, hi = lo + 4096 < n ? lo + 4096 : n;
    total += r ? momentum_count_range<T, true>(v, g, m, r, lo, hi, threshold)
               : momentum_count_range<T, false>(v, g, m, r, lo, hi, threshold);
  }
  return total;
}

template <class T, class I, bool kHasResidual>
int64_t select_range(const T* g, const T* r, int64_t lo, int64_t hi, T threshold, T* values,
                     I* indices, T* new_residual) {
  int64_t w = lo;
  for (int64_t i = lo; i < hi; ++i) {
    const T acc = kHasResidual ? T(g[i] + r[i]) : g[i];
    const bool pick = fabs(acc) >= threshold;
    if (pick) {
      values[w] = acc;
      indices[w] = I(i);
      ++w;
    }
    // acc - acc, not 0: numpy's acc - scatter(values) gives NaN where acc is inf.
    if (new_residual) new_residual[i] = pick ? T(acc - acc) : acc;
  }
  return w - lo;
}

template <class T, class I>
int64_t ef_select(const T* g, const T* r, int64_t n, T threshold, T* values, I* indices,
                  T* new_residual) {
  const int threads = dlc::threads_for(n);
  std::vector<int64_t> starts(size_t(threads) + 1, 0), counts(size_t(threads), 0);
  auto body = [&](int t, int nt) {
    const int64_t per = ((n + nt - 1) / nt + 63) / 64 * 64;
    const int64_t lo = int64_t(t) * per < n ? int64_t(t) * per : n;
    const int64_t hi = lo + per < n ? lo + per : n;
    starts[size_t(t)] = lo;
    counts[size_t(t)] = r ? select_range<T, I, true>(g, r, lo, hi, threshold, values, indices,
                                                      new_residual)
                          : select_range<T, I, false>(g, r, lo, hi, threshold, values, indices,
                                                       new_residual);
  };
  int used = 1;
  if (threads <= 1) {
    body(0, 1);
  } else {
#pragma omp parallel num_threads(threads)
    {
#pragma omp single
      used = omp_get_num_threads();
      body(omp_get_thread_num(), used);
    }
  }
  int64_t total = counts[0];
  for (int t = 1; t < used; ++t) {
    if (counts[size_t(t)] && starts[size_t(t)] != total) {
      memmove(values + total, values + starts[size_t(t)], sizeof(T) * size_t(counts[size_t(t)]));
      memmove(indices + total, indices + starts[size_t(t)], sizeof(I) * size_t(counts[size_t(t)]));
    }
    total += counts[size_t(t)];
  }
  return total;
}

template <class T>
int64_t ef_select_any_index(const T* g, const T* r, int64_t n, T threshold, T* values,
                            void* indices, int index_bytes, T* new_residual) {
  if (index_bytes == 4)
    return ef_select(g, r, n, threshold, values, static_cast<int32_t*>(indices), new_residual);
  return ef_select(g, r, n, threshold, values, static_cast<int64_t*>(indices), new_residual);
}

}  // namespace

extern "C" {

int64_t dlc_count_above_f32(const float* grad, const float* residual, int64_t n, float threshold) {
  return count_above(grad, residual, n, threshold);
}
int64_t dlc_count_above_f64(const double* grad, const double* residual, int64_t n,
                            double threshold) {
  return count_above(grad, residual, n, threshold);
}
int64_t dlc_momentum_count_above_f32(float* velocity, const float* grad, float momentum,
                                     const float* residual, int64_t n, float threshold) {
  return momentum_count_above(velocity, grad, momentum, residual, n, threshold);
}
int64_t dlc_momentum_count_above_f64(double* velocity, const double* grad, double momentum,
                                     const double* residual, int64_t n, double threshold) {
  return momentum_count_above(velocity, grad, momentum, residual, n, threshold);
}
int64_t dlc_ef_select_f32(const float* grad, const float* residual, int64_t n, float threshold,
                          float* values, void* indices, int index_bytes, float* new_residual) {
  return ef_select_any_index(grad, residual, n, threshold, values, indices, index_bytes,
                             new_residual);
}
int64_t dlc_ef_select_f64(const double* grad, const double* residual, int64_t n, double threshold,
                          double* values, void* indices, int index_bytes,
                          double* new_residual) {
  return ef_select_any_index(grad, residual, n, threshold, values, indices, index_bytes,
                             new_residual);
}

}  // extern "C"
