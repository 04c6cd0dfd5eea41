// The model: --model mlp | cnn | resnet | vit (its shape from --vit-*), the convolution
// backend (--conv-backend), the compute precision (--precision) and subnormal numbers
// (--denormals).
#include "run.hpp"

#include <kat/core/bf16_support.hpp>
#include <kat/core/denormals.hpp>
#include <kat/core/precision.hpp>
#include <kat/nn/conv2d.hpp>
#include <kat/nn/models.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kat_train {
namespace {

class ModelChoice : public Component {
public:
  void add_flags(Run &r) override {
    r.app
        .add_option("--model", r.model_name,
                    "mlp (784-256-256-10) | cnn (two 5x5 convolutions, dense 3136-256-10) | "
                    "resnet (ResNet-14 with batch norm) | vit (Vision Transformer: --vit-* below)")
        ->check(CLI::IsMember({"mlp", "cnn", "resnet", "vit"}))
        ->capture_default_str();
    vit_flags_ = {
        add_integer(r.app, "--vit-depth", r.vit.depth, 1, 1024, "vit: transformer encoder blocks"),
        add_integer(r.app, "--vit-width", r.vit.width, 1, 1 << 16, "vit: token width D"),
        add_integer(r.app, "--vit-heads", r.vit.heads, 1, 1 << 12,
                    "vit: attention heads (must divide --vit-width)"),
        add_integer(r.app, "--vit-mlp", r.vit.mlp_hidden, 0, 1 << 20,
                    "vit: MLP hidden width (0: 2 x width)"),
        r.app
            .add_option("--vit-patch", r.vit_patch,
                        "vit: P for P x P patches (must divide 28) | rows (each image row a "
                        "token)")
            ->check(CLI::IsMember({"1", "2", "4", "7", "14", "28", "rows"}))
            ->capture_default_str()};
    conv_backend_flag_ =
        r.app
            .add_option("--conv-backend", conv_backend_,
                        "auto (oneDNN on host memory where built with it, else im2col) | im2col "
                        "(im2col + GEMM everywhere) | dnn (oneDNN; an error where unavailable). "
                        "K-FAC's recording steps always use im2col")
            ->check(CLI::IsMember({"auto", "im2col", "dnn"}))
            ->capture_default_str();
    r.app
        .add_option("--precision", precision_,
                    "fp32 | bf16 (mixed precision: the layers' matrix products and convolutions "
                    "with bf16 inputs and fp32 accumulation; parameters, optimizer state and "
                    "checkpoints stay fp32; docs/precision.md)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
    r.app
        .add_option("--denormals", denormals_,
                    "flush (subnormal numbers become zero on the host threads: SGD's momentum "
                    "of dead units decays into them, which x86 cores compute a hundred times "
                    "slower) | keep (IEEE gradual underflow); kat::set_flush_denormals, "
                    "docs/precision.md")
        ->check(CLI::IsMember({"flush", "keep"}))
        ->capture_default_str();
  }

  void check(Run &r) override {
    for (const auto *o : vit_flags_) {
      if (o->count() > 0 && r.model_name != "vit") {
        throw CLI::ValidationError(o->get_name(),
                                   "applies to --model vit only, not --model " + r.model_name);
      }
    }
    // The models without a convolution: the backend would be accepted and do nothing.
    if (conv_backend_flag_->count() > 0 && (r.model_name == "mlp" || r.model_name == "vit")) {
      throw CLI::ValidationError(conv_backend_flag_->get_name(),
                                 "applies to the models with convolutions (--model cnn or "
                                 "resnet), not --model " +
                                     r.model_name);
    }
  }

  void prepare(Run &r) override {
    auto &vit = r.vit;
    const auto &data = *r.train_set;
    vit.patch = r.vit_patch == "rows" ? std::array<int, 2>{1, data.shape.width}
                                      : std::array<int, 2>{patch(r.vit_patch), patch(r.vit_patch)};
    r.model_id = r.model_name != "vit"
                     ? r.model_name
                     : kat::detail::concat("vit(depth ", vit.depth, ", width ", vit.width,
                                           ", heads ", vit.heads, ", mlp ", vit.mlp_hidden,
                                           ", patch ", r.vit_patch, ")");
    r.make_model = [&r] {
      const auto &d = *r.train_set;
      return r.model_name == "vit"
                 ? kat::nn::models::vit<Scalar, Mem>(d.shape, d.classes, r.vit)
                 : kat::nn::models::by_name<Scalar, Mem>(r.model_name, d.shape, d.classes);
    };
    const auto backend = conv_backend_ == "im2col" ? kat::nn::Conv2dBackend::im2col
                         : conv_backend_ == "dnn"  ? kat::nn::Conv2dBackend::dnn
                                                   : kat::nn::Conv2dBackend::automatic;
    const kat::Precision precision = kat::parse_precision(precision_, "--precision");
    r.configure = [backend, precision](Model &m) {
      kat::nn::set_conv2d_backend(m.layers(), backend);
      m.set_precision(precision);
    };
  }

  void model_ready(Run &, const Space &) override {
    flushing_ = kat::set_flush_denormals(denormals_ == "flush");
  }

  // In bf16, what computes the products: a user on a CPU without bf16 units learns why bf16
  // is slower than fp32 there.
  void describe(Run &r) override {
    if (!flushing_ && denormals_ == "flush" && r.root) {
      std::printf("denormals: warning: this CPU has no flush-to-zero control in this build; "
                  "subnormal numbers are kept\n");
    }
    if (precision_ != "bf16") {
      return;
    }
    const kat::Bf16Support support = kat::bf16_support<Mem>();
    if (support.native) {
      std::printf("precision bf16: products on %s\n", support.description.c_str());
    } else {
      std::printf("precision bf16: warning: %s; --precision fp32 is faster here\n",
                  support.description.c_str());
    }
  }

private:
  // --vit-patch's number (its choices were checked at parsing; this refuses anything else
  // with the flag named instead of std::stoi's bare "stoi").
  static int patch(const std::string &text) {
    char *end = nullptr;
    const long p = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || p < 1 || p > 28) {
      throw kat::ValueError("--vit-patch must be 1, 2, 4, 7, 14, 28 or rows, got '" + text + "'");
    }
    return static_cast<int>(p);
  }

  std::vector<CLI::Option *> vit_flags_;
  CLI::Option *conv_backend_flag_ = nullptr;
  std::string conv_backend_ = "auto";
  std::string precision_ = "fp32";
  std::string denormals_ = "flush";
  bool flushing_ = false;
};
const auto model_choice = register_component<ModelChoice>(10);

} // namespace
} // namespace kat_train
