#include "init_from.h"

#include <ATen/ATen.h>

#include "moe_layer.h"
#include "strata/errors.h"
#include "strata/placement.h"

namespace strata::models {

InitFrom::InitFrom(const Config& config, HfLayout layout) : layout_(layout) {
  const std::string& path = config.get_string("init_from");
  if (path.empty()) return;
  source_ = "[model] init_from " + path;
  checkpoint_ = std::make_unique<MappedHfCheckpoint>(path);
  for (const auto& [name, view] : checkpoint_->tensors())
    if (!views_.emplace(name, view).second) throw UserError(source_ + " gives tensor '" + name + "' twice");
  scope_.emplace(this);
}

InitFrom::~InitFrom() = default;

std::vector<std::string> InitFrom::hf_names(const std::string& full_name) const {
  const std::string hf = layout_.to_hf_name(full_name).name;
  if (layout_.experts > 0)
    if (auto experts = hub_expert_names(hf, layout_.experts); !experts.empty()) return experts;
  return {hf};
}

at::Tensor InitFrom::whole_tensor(const std::string& full_name) {
  const HfName hf = layout_.to_hf_name(full_name);
  std::vector<at::Tensor> parts;
  for (const auto& name : hf_names(full_name)) {
    const auto it = views_.find(name);
    if (it == views_.end()) throw UserError(source_ + " has no tensor '" + name + "' for parameter '" + full_name + "'");
    if (!at::isFloatingType(it->second.scalar_type()))
      throw UserError(source_ + ": tensor '" + name + "' is " + c10::toString(it->second.scalar_type()) + ", not a floating-point dtype");
    parts.push_back(it->second);
    used_.insert(name);
  }
  if (parts.size() > 1) return at::stack(parts);  // one copy: the experts of one projection
  if (!hf.transposed) return parts[0];
  if (parts[0].dim() != 2)
    throw UserError("Hugging Face tensor '" + hf.name + "' is a Conv1D weight and must be 2-D, but has shape " + c10::str(parts[0].sizes()));
  return parts[0].t();  // a strided view: copy_ reads it in place
}

void InitFrom::built(size_t, const std::string& name, nn::Block& block) {
  if (!checkpoint_) return;
  at::NoGradGuard no_grad;
  const Placements placements = nn::parameter_placements(block);
  for (auto& named : block.named_parameters()) {
    const std::string full_name = name + "." + named.key();
    at::Tensor& p = named.value();
    const at::Tensor whole = whole_tensor(full_name);
    const auto placement = placements.find(named.key());
    const at::IntArrayRef wanted = placement == placements.end() ? p.sizes() : at::IntArrayRef(placement->second.shape);
    if (whole.sizes() != wanted)
      throw UserError(source_ + ": tensor for '" + full_name + "' has shape " + c10::str(whole.sizes()) + ", the model needs " +
                      c10::str(wanted));
    p.copy_(placement == placements.end() ? whole : piece_of(whole, placement->second, p.sizes()));
    // A NaN or infinity would train to NaN. (Checked on this rank's piece: the rank holding the
    // rest checks that.)
    if (!at::isfinite(p).all().item<bool>()) throw UserError(source_ + ": tensor for '" + full_name + "' holds NaN or infinite values");
    for (const auto& hf : hf_names(full_name)) checkpoint_->release(views_.at(hf));
    loaded_.insert(full_name);
  }
}

std::string InitFrom::summary() const { return "loaded " + std::to_string(loaded_.size()) + " parameters from " + source_; }

void InitFrom::finish(const nn::Model& model) {
  if (!checkpoint_) return;
  scope_.reset();
  for (const auto& p : model.named_parameters())
    if (!loaded_.count(p.key())) throw UserError(source_ + " has no tensor for parameter '" + p.key() + "'");
  // The blocks another pipeline rank builds are absent here: their tensors are that rank's.
  for (size_t i = 0; i < model.num_blocks(); ++i)
    if (dynamic_cast<const nn::AbsentBlock*>(&model.block(i)))
      for (const auto& shape : nn::block_parameter_shapes(model, i))
        for (const auto& hf : hf_names(model.block_name(i) + "." + shape.name)) used_.insert(hf);
  for (const auto& [name, view] : views_)
    if (!used_.count(name) && !layout_.ignored(name))
      throw UserError("Hugging Face tensor '" + name + "' has no place in this model; check [model] against the checkpoint's config.json");
  views_.clear();
  checkpoint_.reset();
}

}  // namespace strata::models
