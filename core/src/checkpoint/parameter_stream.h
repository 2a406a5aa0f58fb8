// An export (or a consolidation) without the whole model in memory. `strata ckpt export` builds the model without its
// values (nn::SkipInitialDraws: every weight allocated, no page of it touched), asks the model
// for its Hugging Face tensors (views of the parameters: transposed, sliced) and writes them one
// at a time. ParameterStream fills each parameter from the checkpoint just before the first
// tensor that views it is written, checks it is finite, and after the last one gives its pages
// back to the system. Resident at once: one parameter (and its cast copy), not the model. Small
// parameters are filled together, the ones written next up to kFillBatchBytes, so that a
// checkpoint of many small tensors is not read once per tensor (each fill reads every rank
// file's header: 80,000 tensors one at a time would take 80,000 of them).
//
// It streams only where every written tensor views exactly one parameter's storage and no two
// parameters share one; a model whose to_hf computes new tensors (allowed) is filled whole first,
// as before (streams() false: the caller fills and asks to_hf again).
#pragma once

#include <map>
#include <vector>

#include "checkpoint.h"
#include "strata/core/safetensors.h"

namespace strata::engine {

constexpr int64_t kFillBatchBytes = int64_t{8} << 20;

class STRATA_API ParameterStream {
 public:
  // Whether a filled tensor holding NaN or an infinity is refused (an export's weights) or copied
  // as it is (a consolidated checkpoint, optimizer state and all).
  enum class NonFinite { refused, kept };

  // `parameters`: one request per model parameter (its target shares the parameter's storage);
  // `written`: the tensors the export will write.
  // `batch_bytes`: how much a fill takes at most beyond the parameter written next.
  ParameterStream(const Checkpoint& checkpoint, std::vector<TensorRequest> parameters, const NamedTensors& written,
                  NonFinite non_finite = NonFinite::refused, int64_t batch_bytes = kFillBatchBytes);

  bool streams() const { return streams_; }
  // Every parameter filled and checked now (the fallback, and load_checkpoint_model's way).
  void fill_all();
  // For write_safetensors: fill before a tensor's first write, release after its last.
  TensorWriteHooks hooks();

 private:
  void fill(std::vector<TensorRequest>& requests);

  const Checkpoint& checkpoint_;
  std::vector<TensorRequest> parameters_;
  std::map<std::string, size_t> parameter_of_;  // written tensor's name -> index in parameters_
  std::vector<int> writes_left_;                // per parameter: written tensors not yet written
  std::vector<bool> filled_;
  std::vector<size_t> fill_order_;  // parameter indices by first write
  std::vector<size_t> order_at_;    // per parameter: its place in fill_order_
  NonFinite non_finite_;
  int64_t batch_bytes_;
  bool streams_ = true;
};

// A tensor filled from a checkpoint that holds NaN or an infinity would export a model that
// generates nothing: a UserError naming it (`name` without its "model/" prefix).
STRATA_API void refuse_non_finite(const Checkpoint& checkpoint, const TensorRequest& request);

}  // namespace strata::engine
