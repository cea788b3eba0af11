// Batch loops built for several x86-64 levels, one of them picked once per process at run time.
//
// SC_MULTIVERSION defines a function three times: for x86-64-v4 (AVX-512), x86-64-v3 (AVX2)
// and the baseline (x86-64, SSE2), plus a dispatcher that calls the variant of
// cpu::dispatch().level (statecore/cpu_dispatch.h) through a function pointer set at the first
// call. For loops of 64-bit multiplies over a whole batch: AVX-512 has the multiply (vpmullq),
// AVX2 builds it from 32-bit ones. The library itself stays baseline x86-64 (no -march), so one
// wheel runs on every x86-64 CPU.
//
// Function pointers rather than GCC target_clones (an ifunc): the same code builds with GCC and
// clang (the release wheels are built with zig's clang), under the sanitizers too (an ifunc
// resolver runs before their runtime is up), and the choice can be lowered through the
// environment (STATECORE_CPU) to test every variant on one machine.
//
// Usage: a loop body as an SC_MULTIVERSION_INLINE function, then
//   SC_MULTIVERSION(void, name, (const uint8_t* p, int64_t n), (p, n), name_loop)
// defines `void name(const uint8_t* p, int64_t n)` that runs name_loop(p, n) built for the level.
#pragma once

#include "statecore/cpu_dispatch.h"

namespace statecore::cpu {

// `v4`, `v3` or `base`, whichever dispatch().level names.
template <class F>
F pick(F v4, F v3, F base) noexcept {
  switch (dispatch().level) {
    case Level::kV4: return v4;
    case Level::kV3: return v3;
    case Level::kBaseline: break;
  }
  return base;
}

}  // namespace statecore::cpu

// The loop body is inlined into each variant and compiled for that variant's instruction set.
#define SC_MULTIVERSION_INLINE inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__)
// The features of each level (x86-64 psABI), spelled out: clang takes "arch=x86-64-v4" in a
// target attribute without a word and builds the baseline; GCC and clang both take the lists.
#define SC_MULTIVERSION(ret, name, params, args, loop)                                     \
  __attribute__((                                                                          \
      target("sse3,ssse3,sse4.1,sse4.2,popcnt,cx16,sahf,avx,avx2,bmi,bmi2,f16c,fma,"       \
             "lzcnt,movbe,xsave,avx512f,avx512bw,avx512cd,avx512dq,avx512vl"))) static ret \
      name##_x86_64_v4 params {                                                            \
    return loop args;                                                                      \
  }                                                                                        \
  __attribute__((                                                                          \
      target("sse3,ssse3,sse4.1,sse4.2,popcnt,cx16,sahf,avx,avx2,bmi,bmi2,f16c,fma,"       \
             "lzcnt,movbe,xsave"))) static ret name##_x86_64_v3 params {                   \
    return loop args;                                                                      \
  }                                                                                        \
  static ret name##_baseline params { return loop args; }                                  \
  ret name params {                                                                        \
    static const auto chosen =                                                             \
        ::statecore::cpu::pick(&name##_x86_64_v4, &name##_x86_64_v3, &name##_baseline);    \
    return chosen args;                                                                    \
  }
#else
#define SC_MULTIVERSION(ret, name, params, args, loop) \
  ret name params { return loop args; }
#endif
