// Datasets: token streams with a train and a validation split. Core's sampler cuts them into
// windows, shuffles deterministically and batches; a dataset only reads tokens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "strata/component.h"

namespace strata {

enum class Split { Train, Val };

class STRATA_API TokenDataset {
 public:
  virtual ~TokenDataset();
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_tokens(Split split) const = 0;
  // Copies tokens [begin, begin + count) of `split` into `out`. Must be safe to call from a
  // background thread while the caller trains.
  virtual void read(Split split, int64_t begin, int64_t count, int64_t* out) const = 0;
  // True for a dataset that can only be read forwards (a stream the program produces: reading an
  // earlier sample starts it again). Core's sampler refuses [job] shuffle = true for it.
  virtual bool read_in_order() const;
};

struct DataContext {
  std::filesystem::path base_dir;  // relative paths in [data] resolve against this
};

class STRATA_API DatasetFactory : public Component {
 public:
  using Component::Component;
  ~DatasetFactory() override;
  // Bad paths or contents are UserErrors naming the file.
  virtual std::unique_ptr<TokenDataset> open(const Config& config, const DataContext& context) const = 0;
};

}  // namespace strata
