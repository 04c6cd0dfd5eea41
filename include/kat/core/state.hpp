#pragma once
/// @file
/// @brief The one state protocol: named, typed, shaped host copies of a component's state.
///
/// Every stateful component (a model's parameters and running statistics, an optimizer's
/// moments, K-FAC's factors, a data loader's order and position, a trainer's counters)
/// exposes
///
///     kat::StateDict state_dict() const;
///     void load_state_dict(const kat::StateDict &state);
///
/// state_dict() copies the state to the host (it fences: checkpoints are not on the hot path);
/// load_state_dict() checks every entry it needs (name, dtype, shape) before it changes
/// anything, and throws StateError naming the first entry that is missing, unexpected or of
/// the wrong dtype or shape. Composite components nest their parts' dictionaries under a
/// prefix ("model.parameters", "optimizer.exp_avg"); kat/io/checkpoint.hpp writes and reads a
/// StateDict as one file.

#include "kat/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kat {

/// A state dictionary does not match the component that loads it: an entry is missing or
/// unexpected, or has another dtype or shape than the component's.
class StateError : public Error {
public:
  using Error::Error;
};

/// Element type of a state entry. The numeric codes are part of the checkpoint format.
enum class DType : std::uint8_t {
  float32 = 1,
  float64 = 2,
  int32 = 3,
  int64 = 4,
  uint8 = 5,
  uint64 = 6,
};

/// Bytes per element of `dtype`; 0 for a code that is not a DType.
inline std::size_t dtype_size(DType dtype) {
  switch (dtype) {
  case DType::float32:
  case DType::int32:
    return 4;
  case DType::float64:
  case DType::int64:
  case DType::uint64:
    return 8;
  case DType::uint8:
    return 1;
  }
  return 0;
}

/// "float32", "float64", "int32", "int64", "uint8", "uint64", or "unknown dtype <code>".
inline std::string dtype_name(DType dtype) {
  switch (dtype) {
  case DType::float32:
    return "float32";
  case DType::float64:
    return "float64";
  case DType::int32:
    return "int32";
  case DType::int64:
    return "int64";
  case DType::uint8:
    return "uint8";
  case DType::uint64:
    return "uint64";
  }
  return detail::concat("unknown dtype ", static_cast<int>(dtype));
}

namespace detail {

template <class T> struct dtype_of;
template <> struct dtype_of<float> : std::integral_constant<DType, DType::float32> {};
template <> struct dtype_of<double> : std::integral_constant<DType, DType::float64> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<DType, DType::int32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<DType, DType::int64> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<DType, DType::uint8> {};
template <> struct dtype_of<std::uint64_t> : std::integral_constant<DType, DType::uint64> {};

/// "[3, 4]" (a scalar's shape is "[]").
inline std::string shape_string(const std::vector<std::uint64_t> &shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

} // namespace detail

/// The DType of a C++ element type (float, double, std::int32_t, std::int64_t, std::uint8_t,
/// std::uint64_t).
template <class T> constexpr DType dtype_of_v = detail::dtype_of<std::remove_cv_t<T>>::value;

/// One entry: an element type, a shape (empty for a scalar; a matrix's is {rows, cols} with
/// its elements in column-major order) and the elements' bytes in the host's byte order.
struct StateEntry {
  DType dtype = DType::uint8;       ///< the elements' type
  std::vector<std::uint64_t> shape; ///< extents; empty for a scalar
  std::vector<unsigned char> bytes; ///< the elements, in the host's byte order

  /// The number of elements: the product of the shape (1 for a scalar).
  /// @throws StateError if the product does not fit in 64 bits (a shape read from a file is
  ///   untrusted: a wrapped product could match a short byte count)
  std::uint64_t count() const {
    std::uint64_t n = 1;
    bool zero = false;
    for (const std::uint64_t e : shape) {
      zero = zero || e == 0;
    }
    if (zero) {
      return 0;
    }
    for (const std::uint64_t e : shape) {
      if (n > std::numeric_limits<std::uint64_t>::max() / e) {
        throw StateError(detail::concat("kat::StateEntry: shape ", detail::shape_string(shape),
                                        " has more than 2^64 elements"));
      }
      n *= e;
    }
    return n;
  }
};

/// Named state entries, ordered by name. Names are non-empty, at most 4096 bytes, and hold
/// no NUL; a '.' separates the parts of a composite ("optimizer.exp_avg").
class StateDict {
public:
  using map_type = std::map<std::string, StateEntry>; ///< the entries by name

  /// Adds `entry` as `name`.
  /// @throws StateError if the name is empty, too long or holds a NUL, if it is already
  ///   present, if the dtype is not a DType, or if the byte count is not count() times the
  ///   dtype's size.
  void insert(const std::string &name, StateEntry entry) {
    if (name.empty() || name.size() > max_name_length || name.find('\0') != std::string::npos) {
      throw StateError(detail::concat("kat::StateDict: an entry name must have 1 to ",
                                      max_name_length, " bytes and no NUL, got '", name, "'"));
    }
    if (dtype_size(entry.dtype) == 0) {
      throw StateError(
          detail::concat("kat::StateDict: entry '", name, "' has ", dtype_name(entry.dtype)));
    }
    const std::uint64_t count = entry.count();
    if (count > std::numeric_limits<std::uint64_t>::max() / dtype_size(entry.dtype)) {
      throw StateError(detail::concat("kat::StateDict: entry '", name, "' of shape ",
                                      detail::shape_string(entry.shape), " and dtype ",
                                      dtype_name(entry.dtype), " has more than 2^64 bytes"));
    }
    const std::uint64_t bytes = count * dtype_size(entry.dtype);
    if (entry.bytes.size() != bytes) {
      throw StateError(detail::concat("kat::StateDict: entry '", name, "' of shape ",
                                      detail::shape_string(entry.shape), " and dtype ",
                                      dtype_name(entry.dtype), " must hold ", bytes, " bytes, got ",
                                      entry.bytes.size()));
    }
    if (!entries_.emplace(name, std::move(entry)).second) {
      throw StateError(detail::concat("kat::StateDict: entry '", name, "' is already present"));
    }
  }

  /// Adds a scalar.
  template <class T> void set(const std::string &name, T value) {
    insert(name, make_entry(&value, {}));
  }

  /// Adds `values` with `shape` (default: a vector of values.size() elements).
  /// @throws StateError if the shape's element count differs from values.size().
  template <class T>
  void set(const std::string &name, const std::vector<T> &values,
           std::vector<std::uint64_t> shape) {
    StateEntry probe{dtype_of_v<T>, shape, {}};
    if (probe.count() != values.size()) {
      throw StateError(detail::concat("kat::StateDict::set: entry '", name, "' of shape ",
                                      detail::shape_string(shape), " needs ", probe.count(),
                                      " values, got ", values.size()));
    }
    insert(name, make_entry(values.data(), std::move(shape)));
  }
  /// Adds `values` as a vector of shape {values.size()}.
  /// @throws StateError as insert().
  template <class T> void set(const std::string &name, const std::vector<T> &values) {
    set(name, values, {static_cast<std::uint64_t>(values.size())});
  }

  /// Adds a string as its bytes (uint8, [size]).
  void set_text(const std::string &name, const std::string &text) {
    set(name, std::vector<std::uint8_t>(text.begin(), text.end()));
  }

  /// Adds a host copy of a rank-1 or column-major rank-2 view in any memory space (fences).
  template <class View> void set_view(const std::string &name, const View &view) {
    std::vector<typename View::non_const_value_type> host(view.size());
    copy_view(view, host.data(), "set_view", name);
    set(name, host, view_shape(view));
  }

  /// Adds every entry of `child` as "<prefix>.<name>".
  /// @throws StateError as insert().
  void merge(const std::string &prefix, const StateDict &child) {
    for (const auto &[name, entry] : child.entries_) {
      insert(prefix + "." + name, entry);
    }
  }

  /// Whether an entry is named `name`.
  bool contains(const std::string &name) const { return entries_.count(name) != 0; }
  /// The number of entries.
  std::size_t size() const { return entries_.size(); }
  /// Whether there is no entry.
  bool empty() const { return entries_.empty(); }
  /// All entries, ordered by name.
  const map_type &entries() const { return entries_; }

  /// The entry `name`.
  /// @throws StateError "state entry '<name>' is missing" if there is none.
  const StateEntry &at(const std::string &name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end()) {
      throw StateError(detail::concat("state entry '", name, "' is missing"));
    }
    return it->second;
  }

  /// The entries named "<prefix>.<rest>", as "<rest>".
  StateDict sub(const std::string &prefix) const {
    StateDict d;
    const std::string head = prefix + ".";
    for (auto it = entries_.lower_bound(head);
         it != entries_.end() && it->first.compare(0, head.size(), head) == 0; ++it) {
      d.entries_.emplace(it->first.substr(head.size()), it->second);
    }
    return d;
  }

  /// Checks that the entries are exactly `names` (whose prefixes "p." stand for every entry
  /// under p, checked by the part that owns them).
  /// @throws StateError naming `where` and the first missing or unexpected entry.
  void require_names(const std::string &where, const std::vector<std::string> &names) const {
    for (const auto &n : names) {
      if (n.back() == '.' ? !has_prefix(n) : !contains(n)) {
        throw StateError(detail::concat(where, ": state entry '",
                                        n.back() == '.' ? n.substr(0, n.size() - 1) : n,
                                        "' is missing"));
      }
    }
    for (const auto &[name, entry] : entries_) {
      bool expected = false;
      for (const auto &n : names) {
        expected = expected || name == n || (n.back() == '.' && name.compare(0, n.size(), n) == 0);
      }
      if (!expected) {
        throw StateError(detail::concat(where, ": unexpected state entry '", name, "'"));
      }
    }
  }

  /// The entry `name` checked against dtype `T` and `shape`.
  /// @throws StateError naming the entry if it is missing or its dtype or shape differs.
  template <class T>
  const StateEntry &checked(const std::string &name,
                            const std::vector<std::uint64_t> &shape) const {
    const StateEntry &e = at(name);
    if (e.dtype != dtype_of_v<T>) {
      throw StateError(detail::concat("state entry '", name, "' must have dtype ",
                                      dtype_name(dtype_of_v<T>), ", got ", dtype_name(e.dtype)));
    }
    if (e.shape != shape) {
      throw StateError(detail::concat("state entry '", name, "' must have shape ",
                                      detail::shape_string(shape), ", got ",
                                      detail::shape_string(e.shape)));
    }
    return e;
  }

  /// The scalar `name` of type T.
  /// @throws StateError as checked().
  template <class T> T get(const std::string &name) const {
    T value;
    std::memcpy(&value, checked<T>(name, {}).bytes.data(), sizeof(T));
    return value;
  }

  /// The elements of `name`, which must have type T and `shape`.
  /// @throws StateError as checked().
  template <class T>
  std::vector<T> get_vector(const std::string &name,
                            const std::vector<std::uint64_t> &shape) const {
    const StateEntry &e = checked<T>(name, shape);
    std::vector<T> values(e.count());
    if (!values.empty()) {
      std::memcpy(values.data(), e.bytes.data(), e.bytes.size());
    }
    return values;
  }

  /// The string set_text() stored as `name`.
  /// @throws StateError if it is missing or not a uint8 vector.
  std::string text(const std::string &name) const {
    const auto &shape = shape_of<std::uint8_t>(name);
    if (shape.size() != 1) {
      throw StateError(detail::concat("state entry '", name, "' must have rank 1, got shape ",
                                      detail::shape_string(shape)));
    }
    const auto values = get_vector<std::uint8_t>(name, shape);
    return std::string(values.begin(), values.end());
  }

  /// The shape `name` has, with dtype T (for entries whose length the loader learns).
  /// @throws StateError if it is missing or of another dtype.
  template <class T> const std::vector<std::uint64_t> &shape_of(const std::string &name) const {
    return checked<T>(name, at(name).shape).shape;
  }

  /// Copies `name` into `view` (rank 1, or rank 2 column-major), whose extents give the shape
  /// the entry must have (fences).
  /// @throws StateError as checked().
  template <class View> void copy_to(const std::string &name, const View &view) const {
    using T = typename View::non_const_value_type;
    const StateEntry &e = checked<T>(name, view_shape(view));
    using Host = Kokkos::View<const T *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
    const Host host(reinterpret_cast<const T *>(e.bytes.data()), view.size());
    copy_into(host, view, name);
  }

  /// Maximum length of an entry name, in bytes.
  static constexpr std::size_t max_name_length = 4096;

private:
  /// A view's extents as an entry's shape.
  template <class View> static std::vector<std::uint64_t> view_shape(const View &view) {
    static_assert(View::rank == 1 ||
                      std::is_same<typename View::array_layout, Kokkos::LayoutLeft>::value,
                  "kat::StateDict: a matrix must be column-major (LayoutLeft)");
    std::vector<std::uint64_t> shape;
    for (unsigned r = 0; r < View::rank; ++r) {
      shape.push_back(view.extent(r));
    }
    return shape;
  }

  template <class T> static StateEntry make_entry(const T *data, std::vector<std::uint64_t> shape) {
    StateEntry e{dtype_of_v<T>, std::move(shape), {}};
    e.bytes.resize(e.count() * sizeof(T));
    if (!e.bytes.empty()) {
      std::memcpy(e.bytes.data(), data, e.bytes.size());
    }
    return e;
  }

  bool has_prefix(const std::string &head) const {
    const auto it = entries_.lower_bound(head);
    return it != entries_.end() && it->first.compare(0, head.size(), head) == 0;
  }

  template <class View>
  static void require_contiguous(const View &view, const char *what, const std::string &name) {
    if (view.span() != view.size() || !view.span_is_contiguous()) {
      throw ShapeError(detail::concat("kat::StateDict::", what, "('", name,
                                      "'): the view must be contiguous, its span is ", view.span(),
                                      " for ", view.size(), " elements"));
    }
  }

  template <class View>
  static void copy_view(const View &view, typename View::non_const_value_type *out,
                        const char *what, const std::string &name) {
    using T = typename View::non_const_value_type;
    require_contiguous(view, what, name);
    const Kokkos::View<T *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> host(out, view.size());
    const Kokkos::View<const T *, typename View::memory_space, Kokkos::MemoryUnmanaged> flat(
        view.data(), view.size());
    Kokkos::deep_copy(host, flat);
  }

  template <class Host, class View>
  static void copy_into(const Host &host, const View &view, const std::string &name) {
    using T = typename View::non_const_value_type;
    require_contiguous(view, "copy_to", name);
    const Kokkos::View<T *, typename View::memory_space, Kokkos::MemoryUnmanaged> flat(view.data(),
                                                                                       view.size());
    Kokkos::deep_copy(flat, host);
  }

  map_type entries_;
};

} // namespace kat
