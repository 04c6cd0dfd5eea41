// Shared by the command-line programs (kat_train, kat_plan): what became of their standard
// output. A program whose report was lost (a full disk, >/dev/full) must not exit 0.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

namespace kat_examples {

/// Flushes std::cout and stdout. Returns "" when everything written to them arrived, else the
/// system's reason ("No space left on device"; "write failed" when it gave none).
inline std::string stdout_error() {
  // A write that failed earlier (stdout's buffer flushed itself) left only stdout's error flag
  // and errno; the flush here may then set no errno of its own.
  const int earlier = errno;
  errno = 0;
  if (std::fflush(stdout) == 0 && std::ferror(stdout) == 0 && std::cout.flush()) {
    return "";
  }
  const int reason = errno != 0 ? errno : earlier;
  return reason != 0 ? std::strerror(reason) : "write failed";
}

} // namespace kat_examples
