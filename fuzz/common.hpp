#pragma once
// What the fuzz targets share: how a target reports a finding of its own (an accepted input
// that breaks a property the parser documents) and counts of accepted and rejected inputs,
// printed when the fuzzer exits (scripts/fuzz.sh reports them).
//
// A finding aborts, so libFuzzer saves the input as a crash artifact, exactly as for a
// sanitizer report. Expected rejections (kat::Error, std::exception) are not findings.

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>

namespace kat_fuzz {

/// Prints "finding: <message>" and aborts (libFuzzer then writes the input as crash-*).
[[noreturn]] inline void finding(const char *format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fprintf(stderr, "finding: ");
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  std::abort();
}

/// Counts of inputs the parser accepted and rejected; printed at exit as
/// "<target>: accepted A, rejected R inputs".
struct Counts {
  const char *target;
  unsigned long long accepted = 0, rejected = 0;
  explicit Counts(const char *name) : target(name) {}
  ~Counts() {
    std::fprintf(stderr, "%s: accepted %llu, rejected %llu inputs\n", target, accepted, rejected);
  }

  /// One input, the body of every target's LLVMFuzzerTestOneInput: `parse(data, size)`, then,
  /// if it returned, `check(result, data, size)`, counted as accepted; an exception (kat::Error
  /// and nlohmann's errors derive from std::exception) is an expected rejection.
  template <class Parse, class Check>
  int run(const std::uint8_t *data, std::size_t size, Parse parse, Check check) {
    try {
      const auto result = parse(data, size);
      ++accepted;
      check(result, data, size);
    } catch (const std::exception &) {
      ++rejected;
    }
    return 0;
  }
};

} // namespace kat_fuzz
