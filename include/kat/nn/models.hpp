#pragma once
/// @file
/// @brief Reference architectures for 28x28 one-channel images (MNIST, Fashion-MNIST), as
/// built by the example trainer and the benchmarks.

#include "kat/core/error.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/activation.hpp"
#include "kat/nn/batch_norm.hpp"
#include "kat/nn/conv2d.hpp"
#include "kat/nn/dense.hpp"
#include "kat/nn/flatten.hpp"
#include "kat/nn/global_avg_pool2d.hpp"
#include "kat/nn/layer_norm.hpp"
#include "kat/nn/max_pool2d.hpp"
#include "kat/nn/position_embedding.hpp"
#include "kat/nn/residual.hpp"
#include "kat/nn/sequential.hpp"
#include "kat/nn/transformer.hpp"
#include "kat/nn/vit_options.hpp"

#include <array>
#include <functional>
#include <memory>
#include <string>

namespace kat::nn::models {

/// 784-256-256-classes multilayer perceptron with ReLU.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
Sequential<Scalar, MemorySpace> mlp(FeatureShape input, int classes) {
  Sequential<Scalar, MemorySpace> model(input);
  model.template add<Flatten>();
  model.template add<Dense>(input.size(), 256);
  model.template add<ReLU>();
  model.template add<Dense>(256, 256);
  model.template add<ReLU>();
  model.template add<Dense>(256, classes);
  return model;
}

/// The classic two-convolution network: conv5x5-32 (padding 2), ReLU, max-pool 2,
/// conv5x5-64 (padding 2), ReLU, max-pool 2, dense (64·H/4·W/4)-256, ReLU, dense 256-classes.
/// For 28x28 inputs the first dense layer is 3136-256.
///
/// Each ReLU is applied after its max-pool rather than before, on a quarter of the elements:
/// ReLU is monotone non-decreasing, so relu(maxpool(x)) == maxpool(relu(x)) exactly and the
/// gradients agree too (tests/test_pooling.cpp checks both orders bit for bit). The one
/// exception is a NaN activation, which max pooling propagates but ReLU maps to 0.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
Sequential<Scalar, MemorySpace> cnn(FeatureShape input, int classes) {
  Sequential<Scalar, MemorySpace> model(input);
  model.template add<Conv2d>(input.channels, 32, 5, 1, 2);
  model.template add<MaxPool2d>(2);
  model.template add<ReLU>();
  model.template add<Conv2d>(32, 64, 5, 1, 2);
  model.template add<MaxPool2d>(2);
  model.template add<ReLU>();
  model.template add<Flatten>();
  model.template add<Dense>(model.output_shape().size(), 256);
  model.template add<ReLU>();
  model.template add<Dense>(256, classes);
  return model;
}

/// He et al.'s basic block (CVPR 2016, fig. 2 left): conv3x3-BN-ReLU-conv3x3-BN plus the
/// identity, or a 1x1 strided conv + BN projection when the shape changes (option B).
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
std::unique_ptr<Residual<Scalar, MemorySpace>> basic_block(FeatureShape input, int channels,
                                                           int stride) {
  auto block = std::make_unique<Residual<Scalar, MemorySpace>>(input);
  block->template add<Conv2d>(input.channels, channels, 3, stride, 1, 1, false);
  block->template add<BatchNorm2d>(channels);
  block->template add<ReLU>();
  block->template add<Conv2d>(channels, channels, 3, 1, 1, 1, false);
  block->template add<BatchNorm2d>(channels);
  if (stride != 1 || input.channels != channels) {
    block->template add_shortcut<Conv2d>(input.channels, channels, 1, stride, 0, 1, false);
    block->template add_shortcut<BatchNorm2d>(channels);
  }
  return block;
}

/// A small ResNet for 28x28 inputs (the CIFAR-style ResNet-14 of He et al. 2016, sec. 4.2,
/// with n = 2): conv3x3-16 + BN + ReLU; three stages of two basic blocks with 16, 32 and 64
/// channels (stride 2 entering stages 2 and 3: 28 -> 14 -> 7), ReLU after each block;
/// global average pooling; dense 64-classes.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
Sequential<Scalar, MemorySpace> resnet(FeatureShape input, int classes) {
  Sequential<Scalar, MemorySpace> model(input);
  model.template add<Conv2d>(input.channels, 16, 3, 1, 1, 1, false);
  model.template add<BatchNorm2d>(16);
  model.template add<ReLU>();
  for (int stage = 0; stage < 3; ++stage) {
    const int channels = 16 << stage;
    for (int b = 0; b < 2; ++b) {
      const int stride = stage > 0 && b == 0 ? 2 : 1;
      model.add(basic_block<Scalar, MemorySpace>(model.output_shape(), channels, stride));
      model.template add<ReLU>();
    }
  }
  model.template add<GlobalAvgPool2d>();
  model.template add<Dense>(64, classes);
  return model;
}

/// A Vision Transformer classifier (Dosovitskiy et al., ICLR 2021, eq. 1-4) for small images:
/// patch embedding as a Conv2d with kernel = stride = the patch (eq. 1's E, one token per
/// patch, `{width, H/ph, W/pw}`), a learned position embedding (E_pos), `depth` pre-norm
/// TransformerEncoderBlocks, a final LayerNorm, the mean over tokens (GlobalAvgPool2d, instead
/// of a class token) and Dense(width, classes).
/// @param input    the image shape, `{C, H, W}`
/// @param classes  the number of classes (Dense outputs)
/// @param o        width, depth, heads, MLP width, patch (VitOptions)
/// @throws ValueError if the patch does not divide the image or heads does not divide width.
/// @param make_block  builds block i (0-based) for the token shape and the block options (the
///                    tensor-parallel executor passes one that splits it); empty: a
///                    TransformerEncoderBlock
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
Sequential<Scalar, MemorySpace>
vit(FeatureShape input, int classes, VitOptions o = {},
    const std::function<std::unique_ptr<Layer<Scalar, MemorySpace>>(
        FeatureShape, const TransformerBlockOptions &, std::size_t)> &make_block = {}) {
  if (o.patch[0] < 1 || o.patch[1] < 1 || input.height % o.patch[0] != 0 ||
      input.width % o.patch[1] != 0) {
    throw ValueError(kat::detail::concat("kat::nn::models::vit: the patch (", o.patch[0], ", ",
                                         o.patch[1], ") must divide the image (", input.height,
                                         ", ", input.width, ")"));
  }
  if (o.width == 0 || o.depth == 0) {
    throw ValueError(kat::detail::concat("kat::nn::models::vit: width and depth must be > 0, got "
                                         "width = ",
                                         o.width, ", depth = ", o.depth));
  }
  Sequential<Scalar, MemorySpace> model(input);
  model.template add<Conv2d>(static_cast<std::size_t>(input.channels), o.width, o.patch, o.patch);
  const FeatureShape tokens = model.output_shape();
  model.template add<PositionEmbedding>(o.width,
                                        static_cast<std::size_t>(tokens.height * tokens.width));
  TransformerBlockOptions block;
  block.heads = o.heads;
  block.mlp_hidden = o.mlp_hidden != 0 ? o.mlp_hidden : 2 * o.width;
  for (std::size_t i = 0; i < o.depth; ++i) {
    if (make_block) {
      model.add(make_block(tokens, block, i));
    } else {
      model.template add<TransformerEncoderBlock>(tokens, block);
    }
  }
  model.template add<LayerNorm>(o.width);
  model.template add<GlobalAvgPool2d>();
  model.template add<Dense>(o.width, static_cast<std::size_t>(classes));
  return model;
}

/// The model called `name` ("mlp", "cnn", "resnet", "vit" with VitOptions' defaults).
/// @throws ValueError for any other name.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
Sequential<Scalar, MemorySpace> by_name(const std::string &name, FeatureShape input, int classes) {
  if (name == "mlp") {
    return mlp<Scalar, MemorySpace>(input, classes);
  }
  if (name == "cnn") {
    return cnn<Scalar, MemorySpace>(input, classes);
  }
  if (name == "resnet") {
    return resnet<Scalar, MemorySpace>(input, classes);
  }
  if (name == "vit") {
    return vit<Scalar, MemorySpace>(input, classes);
  }
  throw ValueError("kat::nn::models::by_name: name must be mlp, cnn, resnet or vit, got '" + name +
                   "'");
}

} // namespace kat::nn::models
