#pragma once
/// @file
/// @brief The settings of kat::nn::models::vit, apart from the models, so a command line can
/// hold them without compiling the layers.

#include <array>
#include <cstddef>

namespace kat::nn::models {

/// Settings of models::vit.
struct VitOptions {
  /// Patch (height, width) in pixels; must divide the image. {7, 7} on 28x28 images gives 16
  /// tokens of 49 pixels; {1, 28} makes each image row a token (28 tokens).
  std::array<int, 2> patch{7, 7};
  /// Token width D.
  std::size_t width = 64;
  /// Number of TransformerEncoderBlocks.
  std::size_t depth = 4;
  /// Attention heads per block (must divide width).
  std::size_t heads = 4;
  /// MLP hidden width (0: 2·width, ViT's 4·width halved for these small images).
  std::size_t mlp_hidden = 0;
};

} // namespace kat::nn::models
