#pragma once
/// @file
/// @brief One contiguous parameter view and one gradient view for a whole model.

#include "kat/core/error.hpp"
#include "kat/core/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace kat {

/// Owns one flat parameter vector and one flat gradient vector of the same length, and hands
/// out unmanaged views of named blocks inside them. Data-parallel all-reduce, optimizers and
/// checkpoints act on the flat vectors; layers and preconditioners act on the block views of
/// the same memory.
///
/// Usage: reserve() every block, allocate() once, then take views.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class ParameterBuffer {
public:
  using vector_type = Vector<Scalar, MemorySpace>; ///< a flat vector (parameters or gradients)
  using matrix_type = Matrix<Scalar, MemorySpace>; ///< a column-major view of a block

  /// A named range [offset, offset + size) of the flat buffers.
  struct Block {
    std::string name;   ///< as given to reserve()
    std::size_t offset; ///< first scalar in the flat buffers
    std::size_t size;   ///< number of scalars
  };

  /// Reserves `size` scalars for `name` and returns the block's index.
  /// @throws Error if called after allocate().
  std::size_t reserve(std::string name, std::size_t size) {
    if (allocated()) {
      throw Error(detail::concat("kat::ParameterBuffer::reserve(\"", name,
                                 "\"): the buffer is already allocated"));
    }
    blocks_.push_back(Block{std::move(name), size_, size});
    size_ += size;
    return blocks_.size() - 1;
  }

  /// Allocates both flat vectors (zero-filled) for every reserved block.
  void allocate() {
    if (allocated()) {
      throw Error("kat::ParameterBuffer::allocate: already allocated");
    }
    params_ = vector_type("kat::ParameterBuffer::parameters", size_);
    grads_ = vector_type("kat::ParameterBuffer::gradients", size_);
    allocated_ = true;
  }

  /// Whether allocate() has run.
  bool allocated() const { return allocated_; }
  /// Total number of scalars.
  std::size_t size() const { return size_; }
  /// The reserved blocks, in reservation order.
  const std::vector<Block> &blocks() const { return blocks_; }

  /// The flat parameter vector (length size()).
  const vector_type &parameters() const { return params_; }
  /// The flat gradient vector (length size()).
  const vector_type &gradients() const { return grads_; }

  /// Block `index` of the parameters as a rows x cols column-major matrix.
  /// @throws ShapeError if rows * cols differs from the block's size.
  matrix_type parameter_matrix(std::size_t index, std::size_t rows, std::size_t cols) const {
    return as_matrix(params_, index, rows, cols);
  }
  /// Block `index` of the gradients as a rows x cols column-major matrix.
  matrix_type gradient_matrix(std::size_t index, std::size_t rows, std::size_t cols) const {
    return as_matrix(grads_, index, rows, cols);
  }
  /// Block `index` of the parameters as a vector.
  vector_type parameter_vector(std::size_t index) const { return as_vector(params_, index); }
  /// Block `index` of the gradients as a vector.
  vector_type gradient_vector(std::size_t index) const { return as_vector(grads_, index); }

private:
  const Block &checked_block(std::size_t index) const {
    if (!allocated()) {
      throw Error("kat::ParameterBuffer: views requested before allocate()");
    }
    if (index >= blocks_.size()) {
      throw ValueError(detail::concat("kat::ParameterBuffer: block index must be < ",
                                      blocks_.size(), ", got ", index));
    }
    return blocks_[index];
  }
  matrix_type as_matrix(const vector_type &flat, std::size_t index, std::size_t rows,
                        std::size_t cols) const {
    const Block &b = checked_block(index);
    detail::require_extent("kat::ParameterBuffer", "rows * cols of the block", b.size, rows * cols);
    return matrix_type(flat.data() + b.offset, rows, cols);
  }
  vector_type as_vector(const vector_type &flat, std::size_t index) const {
    const Block &b = checked_block(index);
    return vector_type(flat.data() + b.offset, b.size);
  }

  std::vector<Block> blocks_;
  std::size_t size_ = 0;
  bool allocated_ = false;
  vector_type params_;
  vector_type grads_;
};

} // namespace kat
