#include "init_from.h"

#include <algorithm>
#include <cmath>

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
  const std::string prefix = lacks_base_prefix(layout_, checkpoint_->tensors()) ? layout_.base_prefix : "";
  for (const auto& [name, view] : checkpoint_->tensors())
    if (!views_.emplace(prefix + name, view).second) throw UserError(source_ + " gives tensor '" + name + "' twice");
  scope_.emplace(this);
}

InitFrom::~InitFrom() = default;

std::vector<std::string> InitFrom::hf_names(const std::string& full_name) const {
  const std::string hf = layout_.to_hf_name(full_name).name;
  if (layout_.experts > 0)
    if (auto experts = hub_expert_names(hf, layout_.experts); !experts.empty()) return experts;
  return {hf};
}

namespace {
// A slice of the file copied at a time: its pages are let go before the next is read, so loading
// a block holds the block plus this much of the file.
constexpr int64_t kSliceBytes = 16 << 20;
}  // namespace

at::Tensor leading_rows_of(const HfLayout& layout, const std::string& strata_name, const at::Tensor& file, int64_t rows) {
  const bool cut = layout.leading_rows && layout.leading_rows(strata_name) && file.dim() > 0 && file.size(0) > rows;
  return cut ? file.narrow(0, 0, rows) : file;
}

void require_tied_copy_equal(const HfLayout& layout, const at::Tensor* copy, const at::Tensor* original, const std::string& source) {
  if (!layout.tied_copy || !copy || !original) return;
  // Exact equality: a tied model saved by transformers (or by Strata) writes the same values twice.
  if (copy->sizes() == original->sizes() && copy->scalar_type() == original->scalar_type() && at::equal(*copy, *original)) return;
  throw UserError(source + ": tensor '" + layout.tied_copy + "' is not a copy of '" + layout.tied_original +
                  "', so the checkpoint's output head is not its embedding, but [model] tie_embeddings = true ties them; set [model] "
                  "tie_embeddings = false to load both");
}

InitFrom::Source InitFrom::source_of(const std::string& full_name) {
  Source source;
  source.transposed = layout_.to_hf_name(full_name).transposed;
  for (const auto& name : hf_names(full_name)) {
    const auto it = views_.find(name);
    if (it == views_.end()) throw UserError(source_ + " has no tensor '" + name + "' for parameter '" + full_name + "'");
    if (!at::isFloatingType(it->second.scalar_type()))
      throw UserError(source_ + ": tensor '" + name + "' is " + c10::toString(it->second.scalar_type()) + ", not a floating-point dtype");
    if (source.transposed && it->second.dim() != 2)
      throw UserError("Hugging Face tensor '" + name + "' is a Conv1D weight and must be 2-D, but has shape " + c10::str(it->second.sizes()));
    source.views.push_back(it->second);
    used_.insert(name);
  }
  return source;
}

void InitFrom::check_finite(const at::Tensor& loaded, const std::string& full_name) const {
  // A NaN or infinity would train to NaN. (Checked on what this rank loads: a rank holding the
  // rest of a split tensor checks that.) The extremes propagate NaN and show an infinity, without
  // isfinite's temporaries the size of the slice.
  if (loaded.numel() == 0) return;
  const auto [lowest, highest] = at::aminmax(loaded);
  if (!std::isfinite(lowest.item<double>()) || !std::isfinite(highest.item<double>())) throw UserError(source_ + ": tensor for '" + full_name + "' holds NaN or infinite values");
}

void InitFrom::built(size_t, const std::string& name, nn::Block& block) {
  if (!checkpoint_) return;
  at::NoGradGuard no_grad;
  const Placements placements = nn::parameter_placements(block);
  for (auto& named : block.named_parameters()) {
    const std::string full_name = name + "." + named.key();
    at::Tensor& p = named.value();
    Source source = source_of(full_name);
    if (source.views.size() == 1 && !source.transposed)  // a shorter context takes the first positions
      source.views[0] = leading_rows_of(layout_, full_name, source.views[0],
                                        placements.count(named.key()) ? placements.at(named.key()).shape[0] : p.size(0));
    // The whole tensor in Strata's layout: the experts of one projection stacked (one copy), a
    // Conv1D weight as a transposed view.
    const at::Tensor whole = source.views.size() > 1 ? at::stack(source.views) : source.transposed ? source.views[0].t() : source.views[0];
    const auto placement = placements.find(named.key());
    const at::IntArrayRef wanted = placement == placements.end() ? p.sizes() : at::IntArrayRef(placement->second.shape);
    if (whole.sizes() != wanted)
      throw UserError(source_ + ": tensor for '" + full_name + "' has shape " + c10::str(whole.sizes()) + ", the model needs " +
                      c10::str(wanted));
    if (placement != placements.end() || source.views.size() > 1 || p.dim() == 0) {
      p.copy_(placement == placements.end() ? whole : piece_of(whole, placement->second, p.sizes()));
      check_finite(p, full_name);
    } else {  // the whole parameter from one file tensor: slice by slice, in file order
      const at::Tensor& file = source.views[0];
      const int64_t rows = file.size(0), row_bytes = static_cast<int64_t>(file.nbytes()) / std::max<int64_t>(rows, 1);
      const int64_t per = std::max<int64_t>(1, kSliceBytes / std::max<int64_t>(row_bytes, 1));
      for (int64_t row = 0; row < rows; row += per) {
        const int64_t n = std::min(per, rows - row);
        const at::Tensor slice = file.narrow(0, row, n);
        at::Tensor into = source.transposed ? p.narrow(1, row, n) : p.narrow(0, row, n);
        into.copy_(source.transposed ? slice.t() : slice);
        check_finite(into, full_name);
        checkpoint_->release(slice);
      }
    }
    for (const auto& view : source.views) checkpoint_->release(view);
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
  const auto find = [this](const char* name) -> const at::Tensor* {
    const auto it = name ? views_.find(name) : views_.end();
    return it == views_.end() ? nullptr : &it->second;
  };
  require_tied_copy_equal(layout_, find(layout_.tied_copy), find(layout_.tied_original), source_);
  for (const auto& [name, view] : views_)
    if (!used_.count(name) && !layout_.ignored(name))
      throw UserError("Hugging Face tensor '" + name + "' has no place in this model; check [model] against the checkpoint's config.json");
  views_.clear();
  checkpoint_.reset();
}

}  // namespace strata::models
