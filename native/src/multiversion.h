// SC_TARGET_CLONES_VEC: build the function it precedes three times, for x86-64-v4 (AVX-512),
// x86-64-v3 (AVX2) and the baseline, picked once at load by an ifunc (GCC target_clones). For
// loops of 64-bit multiplies over a whole batch: AVX-512 has the multiply (vpmullq), AVX2 builds
// it from 32-bit ones and still beats the scalar loop; the wheel stays baseline x86-64.
// Empty elsewhere and under the sanitizers (an ifunc resolver runs before their runtime is up).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define SC_TARGET_CLONES_VEC \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SC_TARGET_CLONES_VEC
#endif
