// Tiny unit-test harness for the native core (no third-party test framework, so the C++ tests
// build anywhere the library builds, also under ASan/UBSan/TSan).
//
// Usage, one executable per test_*.cpp (`./test_x [name substring]` runs a subset):
//   #include "check.h"
//   TEST(put_then_get) { CHECK(x); CHECK_EQ(a, b); CHECK_THROWS(f(), std::out_of_range); }
//   THREADED_TEST(reader_thread_races_writes) { ... }   // starts threads
//   TEST_MAIN()
//
// With CHECK_THREADED_ONLY=1 in the environment only the THREADED_TESTs run (and a suite that
// has none fails): the ThreadSanitizer build finds races only where threads run, and runs the
// long single-threaded randomized tests of a suite at many times their cost for nothing.
//
// Every CHECK counts as one check; a failing check prints "file:line: ..." to stderr and the test
// continues (so one run shows every failure). An exception escaping a TEST counts as a failure.
// The last line printed is exactly "N passed, M failed"; the process exits nonzero iff M > 0,
// which is what ctest looks at.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace check {

struct Counters {
  long long passed = 0;
  long long failed = 0;
};
inline Counters& counters() {
  static Counters c;
  return c;
}

struct TestCase {
  const char* name;
  void (*fn)();
  bool threaded;
};
inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> r;
  return r;
}
struct Registrar {
  Registrar(const char* name, void (*fn)(), bool threaded = false) {
    registry().push_back({name, fn, threaded});
  }
};

inline void pass() { ++counters().passed; }
inline void fail(const char* file, int line, const std::string& what) {
  ++counters().failed;
  std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what.c_str());
}

// Streams values that support operator<<; other types print as "<?>".
template <class T, class = void>
struct Printable : std::false_type {};
template <class T>
struct Printable<T, decltype(void(std::declval<std::ostream&>() << std::declval<const T&>()))>
    : std::true_type {};
template <class T>
std::string show(const T& v) {
  if constexpr (Printable<T>::value) {
    std::ostringstream os;
    os << v;
    return os.str();
  } else {
    return "<?>";
  }
}

template <class A, class B>
void check_eq(const A& a, const B& b, const char* ea, const char* eb, const char* file, int line) {
  if (a == b) {
    pass();
  } else {
    fail(file, line, std::string(ea) + " == " + eb + "  (" + show(a) + " vs " + show(b) + ")");
  }
}

// Runs every registered test in registration order (only those whose name contains `filter`,
// when given; only THREADED_TESTs with `threaded_only`); returns the process exit code.
inline int run_all(const char* filter = nullptr, bool threaded_only = false) {
  int ran = 0;
  for (const TestCase& t : registry()) {
    if (filter && std::string(t.name).find(filter) == std::string::npos) continue;
    if (threaded_only && !t.threaded) continue;
    ++ran;
    long long before = counters().failed;
    try {
      t.fn();
    } catch (const std::exception& e) {
      fail(t.name, 0, std::string("uncaught exception: ") + e.what());
    } catch (...) {
      fail(t.name, 0, "uncaught non-standard exception");
    }
    std::fprintf(stderr, "[%s] %s\n", counters().failed == before ? " ok " : "FAIL", t.name);
  }
  if (threaded_only && ran == 0)
    fail(__FILE__, __LINE__, "CHECK_THREADED_ONLY: no THREADED_TEST ran");
  std::printf("%lld passed, %lld failed\n", counters().passed, counters().failed);
  return counters().failed == 0 ? 0 : 1;
}

// True in a ThreadSanitizer build (gcc defines __SANITIZE_THREAD__, clang has the feature): a
// threaded test may take fewer rounds there, where every memory access costs many times more.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// CHECK_THREADED_ONLY set (and not "0") in the environment.
inline bool threaded_only_from_env() {
  const char* v = std::getenv("CHECK_THREADED_ONLY");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

}  // namespace check

#define TEST(name)                                                 \
  static void name();                                              \
  static const ::check::Registrar name##_registrar_(#name, &name); \
  static void name()

#define THREADED_TEST(name)                                              \
  static void name();                                                    \
  static const ::check::Registrar name##_registrar_(#name, &name, true); \
  static void name()

#define CHECK(cond)                             \
  do {                                          \
    if (cond) {                                 \
      ::check::pass();                          \
    } else {                                    \
      ::check::fail(__FILE__, __LINE__, #cond); \
    }                                           \
  } while (0)

#define CHECK_EQ(a, b) ::check::check_eq((a), (b), #a, #b, __FILE__, __LINE__)

#define CHECK_THROWS(expr, ExceptionType)                                 \
  do {                                                                    \
    bool caught_ = false;                                                 \
    try {                                                                 \
      (void)(expr);                                                       \
    } catch (const ExceptionType&) {                                      \
      caught_ = true;                                                     \
    } catch (...) {                                                       \
    }                                                                     \
    if (caught_) {                                                        \
      ::check::pass();                                                    \
    } else {                                                              \
      ::check::fail(__FILE__, __LINE__, #expr " throws " #ExceptionType); \
    }                                                                     \
  } while (0)

// `./test_x [substring]` runs the tests whose name contains the substring.
#define TEST_MAIN()                                                                           \
  int main(int argc, char** argv) {                                                           \
    return ::check::run_all(argc > 1 ? argv[1] : nullptr, ::check::threaded_only_from_env()); \
  }
