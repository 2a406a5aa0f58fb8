#include "fp8_layers.h"

namespace strata::fp8 {
namespace {

bool contains_any(const std::string& name, const StringList& parts) {
  for (const auto& part : parts)
    if (name.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

LayerChoice choose_layers(nn::Model& model, const StringList& include, const StringList& exclude) {
  LayerChoice choice;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<nn::Linear*>(item.value().get());
    if (!linear) continue;
    const std::string& name = item.key();
    if ((!include.empty() && !contains_any(name, include)) || contains_any(name, exclude)) continue;
    const auto shape = [&name](int64_t out, int64_t in) { return name + " [" + std::to_string(out) + " x " + std::to_string(in) + "]"; };
    const auto aligned = [](int64_t out, int64_t in) { return out % kDimMultiple == 0 && in % kDimMultiple == 0; };
    if (!aligned(linear->out_features, linear->in_features)) {
      choice.too_small.push_back(shape(linear->out_features, linear->in_features));
      continue;
    }
    choice.fp8.emplace_back(name, linear);
    const int64_t out = linear->weight.size(0), in = linear->weight.size(1);
    if (!aligned(out, in)) choice.misaligned.push_back(shape(out, in));
  }
  return choice;
}

bool names_a_linear(nn::Model& model, const std::string& part) {
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (dynamic_cast<nn::Linear*>(item.value().get()) && item.key().find(part) != std::string::npos) return true;
  return false;
}

}  // namespace strata::fp8
