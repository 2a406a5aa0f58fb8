// Model factories: build a strata::nn::Model from [model].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/component.h"
#include "strata/cost.h"
#include "strata/nn.h"
#include "strata/optimizer.h"

namespace strata {

class STRATA_API ModelFactory : public Component {
 public:
  using Component::Component;
  ~ModelFactory() override;
  // Parameters are initialised from the current global RNG state (core seeds it).
  virtual std::shared_ptr<nn::Model> create(const Config& config) const = 0;
  // The model as tensor-parallel rank `shard.index` of `shard.parts` builds it: split layers at
  // their local shapes (nn.h), with exactly the values of the same pieces of create()'s model.
  // This default builds create()'s model for one part and refuses more.
  virtual std::shared_ptr<nn::Model> create_shard(const Config& config, nn::TensorShard shard) const;
  // Why this model cannot be split into `parts` tensor-parallel pieces (sizes that do not divide,
  // named with their keys), or empty when it can. `strata plan` reports it; create_shard refuses
  // the same. This default allows one part only, as the default create_shard does.
  virtual std::string split_problem(const Config& config, int64_t parts) const;
  // What each rank holds of the model split into `parts` (a line per split layer kind: heads,
  // kv heads split or replicated, MLP columns, vocabulary rows), shown by `strata plan`. This
  // default says nothing.
  virtual std::string describe_split(const Config& config, int64_t parts) const;

  // The sizes `strata tune`'s cost model reads (strata/cost.h), from `config` alone: it must not
  // build the model, which may not fit. This default counts the parameters of create()'s model
  // (so it does build it) and leaves the transformer sizes at 0; the cost model then predicts model
  // states only.
  virtual ModelShape shape(const Config& config) const;

  // Hugging Face interchange (transformers' names and layouts). A model without an equivalent
  // keeps these defaults, which refuse with a UserError. to_hf may return views of the model's
  // parameters (transposed, sliced; not overlapping one another): the export lays each out as it
  // writes it, so it never holds a second model.
  virtual NamedTensors to_hf(const nn::Model& model, const Config& config) const;
  virtual NamedTensors from_hf(const NamedTensors& hf, const Config& config) const;
  virtual std::string hf_config_json(const Config& config) const;
};

}  // namespace strata
