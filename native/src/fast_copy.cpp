#include "fast_copy.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif


namespace cmt {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2"))) void copy_nt_avx2(char* dst, const char* src, size_t n) {
  // Align the destination to 32 bytes; streaming stores need it.
  size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t blocks = n / 128;
  for (size_t i = 0; i < blocks; ++i) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
    src += 128;
    dst += 128;
  }
  memcpy(dst, src, n - blocks * 128);
  _mm_sfence();  // streaming stores are weakly ordered: make them visible before the DMA
}
#endif

bool cpu_can_stream() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx2") != 0;
  return yes;
#else
  return false;
#endif
}

}  // namespace

void copy_stream(void* dst, const void* src, size_t n, bool streaming) {
#if defined(__x86_64__)
  if (streaming && n >= 4096 && cpu_can_stream()) {
    return copy_nt_avx2(static_cast<char*>(dst), static_cast<const char*>(src), n);
  }
#endif
  memcpy(dst, src, n);
}

#if defined(__x86_64__)
// CLDEMOTE is encoded in the hint-NOP space (0F 1C /0): CPUs without it execute it as a NOP.
__attribute__((target("cldemote"))) static void demote_x86(char* p, size_t n) {
  char* end = p + n;
  for (char* q = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63)); q < end; q += 64) {
    _cldemote(q);
  }
}
#endif

void demote_lines(void* p, size_t n) {
#if defined(__x86_64__)
  demote_x86(static_cast<char*>(p), n);
#else
  (void)p;
  (void)n;
#endif
}

}  // namespace cmt
