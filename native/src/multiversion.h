// SC_TARGET_CLONES_V4: build the function it precedes twice, for x86-64-v4 (AVX-512) and the
// baseline, picked once at load by an ifunc (GCC target_clones). For loops of 64-bit multiplies
// over a whole batch, which only AVX-512 (vpmullq) vectorizes; the wheel stays baseline x86-64.
// Empty elsewhere and under the sanitizers (an ifunc resolver runs before their runtime is up).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define SC_TARGET_CLONES_V4 __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define SC_TARGET_CLONES_V4
#endif
