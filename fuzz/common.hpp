#pragma once
// What the fuzz targets share: how a target reports a finding of its own (an accepted input
// that breaks a property the parser documents) and counts of accepted and rejected inputs,
// printed when the fuzzer exits (scripts/fuzz.sh reports them).
//
// A finding aborts, so libFuzzer saves the input as a crash artifact, exactly as for a
// sanitizer report. Expected rejections (kat::Error, std::exception) are not findings.

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

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
};

} // namespace kat_fuzz
