// The run-time choice of multiversioned loops (multiversion.h): what the CPU and the OS support,
// lowered by STATECORE_CPU.
#include "statecore/cpu_dispatch.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace statecore::cpu {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
bool bits(uint32_t reg, uint32_t mask) { return (reg & mask) == mask; }
uint32_t bit(int i) { return uint32_t{1} << i; }

// The levels of the x86-64 psABI ("Micro-architecture levels"): every feature of the level and
// of the ones below it, and the OS saving the vector registers it uses (XCR0, read by XGETBV
// once OSXSAVE says the OS enabled it).
Level detect() {
  uint32_t a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Level::kBaseline;
  const uint32_t ecx1 = c;
  uint32_t ebx7 = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) ebx7 = b;
  uint32_t ecx81 = 0;
  if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) ecx81 = c;

  // x86-64-v2: SSE3, SSSE3, CMPXCHG16B, SSE4.1, SSE4.2, POPCNT; LAHF/SAHF in 64-bit mode.
  const bool v2 =
      bits(ecx1, bit(0) | bit(9) | bit(13) | bit(19) | bit(20) | bit(23)) && bits(ecx81, bit(0));
  // x86-64-v3 adds FMA, MOVBE, XSAVE, OSXSAVE, AVX, F16C; BMI1, AVX2, BMI2; LZCNT.
  const bool v3_cpu = v2 && bits(ecx1, bit(12) | bit(22) | bit(26) | bit(27) | bit(28) | bit(29)) &&
                      bits(ebx7, bit(3) | bit(5) | bit(8)) && bits(ecx81, bit(5));
  if (!v3_cpu) return Level::kBaseline;
  uint32_t xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if (!bits(xcr0_lo, bit(1) | bit(2))) return Level::kBaseline;  // XMM and YMM state
  // x86-64-v4 adds AVX512F, AVX512DQ, AVX512CD, AVX512BW, AVX512VL, and the opmask and ZMM
  // state saved by the OS.
  const bool v4 = bits(ebx7, bit(16) | bit(17) | bit(28) | bit(30) | bit(31)) &&
                  bits(xcr0_lo, bit(5) | bit(6) | bit(7));
  return v4 ? Level::kV4 : Level::kV3;
}
#else
Level detect() { return Level::kBaseline; }
#endif

Dispatch make_dispatch() {
  Dispatch d{};
  d.detected = detect();
  d.level = d.detected;
  d.request_valid = true;
  const char* env = std::getenv("STATECORE_CPU");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return d;
  Level asked = Level::kBaseline;
  if (std::strcmp(env, "x86-64-v4") == 0) {
    asked = Level::kV4;
  } else if (std::strcmp(env, "x86-64-v3") == 0) {
    asked = Level::kV3;
  } else if (std::strcmp(env, "baseline") != 0) {
    d.request_valid = false;
  }
  if (static_cast<int>(asked) < static_cast<int>(d.level)) d.level = asked;
  return d;
}

}  // namespace

const Dispatch& dispatch() noexcept {
  static const Dispatch d = make_dispatch();
  return d;
}

const char* level_name(Level level) noexcept {
  switch (level) {
    case Level::kV4: return "x86-64-v4";
    case Level::kV3: return "x86-64-v3";
    case Level::kBaseline: break;
  }
  return "baseline";
}

}  // namespace statecore::cpu
