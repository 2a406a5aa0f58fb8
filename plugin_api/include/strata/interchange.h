// Moving weights between Strata models and Hugging Face checkpoints.
#pragma once

#include <filesystem>
#include <string>

#include "strata/nn.h"
#include "strata/optimizer.h"

namespace strata {

// A Hugging Face checkpoint: a .safetensors file, or a directory holding model.safetensors or
// model.safetensors.index.json with its shards. Malformed files are UserErrors.
STRATA_API NamedTensors read_hf_checkpoint(const std::filesystem::path& path);

// The same checkpoint mapped into memory instead of read: its tensors are read-only views of the
// files (nothing is copied; writing into one is an error the MMU reports), so a rank that copies
// out one block at a time and releases it holds about one block of the file, never the whole
// file ([model] init_from under sharding).
class STRATA_API MappedHfCheckpoint {
 public:
  explicit MappedHfCheckpoint(const std::filesystem::path& path);
  ~MappedHfCheckpoint();
  const NamedTensors& tensors() const;
  // Lets go of the file pages under `view` (one of tensors()), read again from the page cache if
  // it is touched again; anything else is left alone.
  void release(const at::Tensor& view) const;

 private:
  struct Files;
  std::shared_ptr<const Files> files_;
  NamedTensors tensors_;
};

// Copies `tensors` (Strata names) into the model's parameters. Every parameter must be given
// exactly once with its shape; anything missing, extra or mis-shaped is a UserError naming it
// and `source`.
STRATA_API void load_parameters(nn::Model& model, const NamedTensors& tensors, const std::string& source);

}  // namespace strata
