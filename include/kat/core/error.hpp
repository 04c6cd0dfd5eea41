#pragma once
/// @file
/// @brief KAT's exception hierarchy. Every error names the argument, the expected and the
/// actual value, so a user can fix the call without reading KAT's source.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kat {

/// Base of every exception KAT throws.
class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A view or tensor has the wrong extents for the operation.
class ShapeError : public Error {
public:
  using Error::Error;
};

/// An argument or hyperparameter is outside its valid range.
class ValueError : public Error {
public:
  using Error::Error;
};

/// A file cannot be opened, read or written.
class IOError : public Error {
public:
  using Error::Error;
};

/// A file was read but its content is not what its format requires (bad magic number,
/// inconsistent dimensions, truncated or trailing data).
class FormatError : public Error {
public:
  using Error::Error;
};

/// A computation produced or was handed non-finite values.
class NumericalError : public Error {
public:
  using Error::Error;
};

namespace detail {

/// Streams every argument into one string.
template <class... Args> std::string concat(Args &&...args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

/// Throws ShapeError "<where>: <what> must be <expected>, got <actual>" when they differ.
template <class T>
void require_extent(const char *where, const char *what, const T &expected, const T &actual) {
  if (!(expected == actual)) {
    throw ShapeError(concat(where, ": ", what, " must be ", expected, ", got ", actual));
  }
}

} // namespace detail
} // namespace kat
