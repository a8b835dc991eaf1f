// Library controls: ABI version, OpenMP thread count, and the SIMD switch the tests flip to
// check the scalar paths too.
#include <omp.h>

#include <atomic>

#include "dlcomm_native.h"

namespace {
std::atomic<int> g_threads{0};  // 0: OpenMP's default
std::atomic<int> g_simd{1};

bool cpu_has_simd() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}
}  // namespace

namespace dlc {
int threads_for(int64_t n) {
  if (n < kParallelMin) return 1;
  const int t = g_threads.load(std::memory_order_relaxed);
  return t > 0 ? t : omp_get_max_threads();
}

bool simd_enabled() {
  static const bool has = cpu_has_simd();
  return has && g_simd.load(std::memory_order_relaxed) != 0;
}
}  // namespace dlc

extern "C" {
int dlc_abi_version(void) { return 1; }
void dlc_set_num_threads(int n) { g_threads.store(n > 0 ? n : 0); }
int dlc_get_num_threads(void) {
  const int t = g_threads.load();
  return t > 0 ? t : omp_get_max_threads();
}
int64_t dlc_parallel_min(void) { return dlc::kParallelMin; }
int dlc_simd_available(void) { return cpu_has_simd() ? 1 : 0; }
void dlc_set_simd(int enable) { g_simd.store(enable ? 1 : 0); }
}
