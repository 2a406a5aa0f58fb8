// [model] init_from: a Hugging Face checkpoint loaded block by block, as the factory adds each block.
//
// The checkpoint is mapped, not read (MappedHfCheckpoint): its tensors are views of the files. The
// moment the factory adds a block, InitFrom (an nn::BuildKeeper installed inside the build) copies
// each of the block's parameters from its view, converted to Strata's layout (GPT-2's Conv1D
// weights transposed, Mixtral's per-expert tensors stacked) and cut to this rank's piece where the
// parameter is split over tensor-parallel ranks (its placement), then lets go of the block's file
// pages. Keeper scopes nest and the innermost sees a block first, so a sharding pass's keeper
// (fsdp's sharded initialisation) then keeps its part of the loaded values. A rank therefore holds
// what it keeps plus about one block, never the whole checkpoint or model; a pipeline rank never
// touches the blocks other stages build (they are absent). PyTorch's DCP and torchtitan reach the
// same by reading each rank's slices into meta-initialised shards.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "strata/interchange.h"
#include "strata/nn.h"

namespace strata::models {

// How one Strata parameter is stored in the Hugging Face checkpoint.
struct HfName {
  std::string name;
  bool transposed = false;  // GPT-2's Conv1D weights are stored (in, out)
};
using ToHfName = HfName (*)(const std::string& strata_name);

// A factory's mapping to its Hugging Face architecture.
struct HfLayout {
  ToHfName to_hf_name;
  bool (*ignored)(const std::string& hf_name);  // tensors some checkpoints carry that have no parameter (buffers, tied copies)
  int64_t experts = 0;                          // > 0: expert weights are stored one tensor per expert (Mixtral)
  // Parameters (Strata names) whose file tensor may hold more rows than the model's, of which the
  // model takes the first: GPT-2's learned positions, for a context shorter than n_positions.
  bool (*leading_rows)(const std::string& strata_name) = nullptr;
  // The prefix the task model puts before its base model's names (transformers' base_model_prefix
  // and a dot: "transformer." for GPT-2, "model." for Llama). A checkpoint of the base model alone
  // (GPT-2's own on the hub is a GPT2Model) has none; its names are read with it.
  const char* base_prefix = nullptr;
  // A tied model's output head is its token embedding, yet checkpoints may store it as a tensor of
  // its own: {that tensor, the embedding}, as the checkpoint names them (none when untied). The
  // copy must hold the embedding's values; different values are the head of an untied model.
  const char* tied_copy = nullptr;
  const char* tied_original = nullptr;
};

// Refuses a checkpoint whose tied copy (see HfLayout) is not its embedding: `copy` and `original`
// are the checkpoint's tensors of those names, nullptr where it has none. `source` names it.
void require_tied_copy_equal(const HfLayout& layout, const at::Tensor* copy, const at::Tensor* original, const std::string& source);

// A checkpoint's names as the task model has them: with the layout's base prefix added to every
// name where no name has it (a base-model checkpoint).
template <class Names>
bool lacks_base_prefix(const HfLayout& layout, const Names& names) {
  if (!layout.base_prefix) return false;
  for (const auto& entry : names)
    if (entry.first.starts_with(layout.base_prefix)) return false;
  return !names.empty();
}

// `file` cut to the model's `rows` where the layout lets `strata_name` take leading rows.
at::Tensor leading_rows_of(const HfLayout& layout, const std::string& strata_name, const at::Tensor& file, int64_t rows);

class InitFrom final : public nn::BuildKeeper {
 public:
  // Does nothing when [model] init_from is empty; else maps the checkpoint and takes part in the
  // build until finish().
  InitFrom(const Config& config, HfLayout layout);
  ~InitFrom() override;
  InitFrom(const InitFrom&) = delete;
  InitFrom& operator=(const InitFrom&) = delete;

  void built(size_t index, const std::string& name, nn::Block& block) override;
  std::string summary() const override;
  // After the factory's last block: every parameter was loaded, and every checkpoint tensor has a
  // place (a parameter of a block this rank built or of one it left to another pipeline rank).
  void finish(const nn::Model& model);

 private:
  // The checkpoint tensor(s) for Strata parameter `full_name` (several: one per expert), checked.
  struct Source {
    std::vector<at::Tensor> views;
    bool transposed = false;
  };
  Source source_of(const std::string& full_name);
  std::vector<std::string> hf_names(const std::string& full_name) const;
  void check_finite(const at::Tensor& loaded, const std::string& full_name) const;

  HfLayout layout_;
  std::string source_;
  std::unique_ptr<MappedHfCheckpoint> checkpoint_;
  std::map<std::string, at::Tensor> views_;
  std::set<std::string> used_, loaded_;
  std::optional<nn::KeepAtBuild> scope_;
};

}  // namespace strata::models
