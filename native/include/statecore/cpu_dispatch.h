// Which x86-64 level the multiversioned batch loops of this process run (native/src/
// multiversion.h builds them): the highest level the CPU and the OS support, lowered by the
// environment variable STATECORE_CPU to test the other variants on one machine.
#pragma once

namespace statecore::cpu {

// x86-64 psABI micro-architecture levels that multiversioned loops are built for.
enum class Level : int { kBaseline = 0, kV3 = 1, kV4 = 2 };

struct Dispatch {
  Level level;     // what multiversioned loops run: the lower of `detected` and the request
  Level detected;  // the highest level this CPU and OS support (CPUID, XGETBV)
  // STATECORE_CPU is unset, empty, "auto" or a level name ("baseline", "x86-64-v3",
  // "x86-64-v4"). Any other value selects the baseline: never a faster path than asked for.
  bool request_valid;
};

// The dispatch of this process: reads the CPU and STATECORE_CPU once, at the first call
// (thread-safe). Non-x86-64 builds always report the baseline.
const Dispatch& dispatch() noexcept;

// "baseline", "x86-64-v3" or "x86-64-v4".
const char* level_name(Level level) noexcept;

}  // namespace statecore::cpu
