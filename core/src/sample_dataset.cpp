// A dataset the program produces sample by sample (strata/accelerate.h, sample_dataset): the
// map-style dataset of PyTorch (__getitem__ by index) in Strata's terms. Core's sampler reads
// whole windows of seq_len + 1 tokens at token offsets window x seq_len, so window w is sample w:
// the sampler's shuffle, resume position and elastic restarts address samples by index and stay
// exact as long as the callback is a pure function of (split, index).
#include <string>

#include <ATen/ATen.h>

#include "strata/accelerate.h"
#include "strata/errors.h"

namespace strata {

namespace {

class SampleTokens final : public TokenDataset {
 public:
  SampleTokens(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train, int64_t validation, SampleFn sample)
      : name_(std::move(name)), vocab_size_(vocab_size), seq_len_(seq_len), train_(train), validation_(validation), sample_(std::move(sample)) {}
  int64_t vocab_size() const override { return vocab_size_; }
  // Windows of seq_len + 1 overlap by one token in a stream: n samples span n seq_len + 1.
  int64_t num_tokens(Split split) const override { return (split == Split::Train ? train_ : validation_) * seq_len_ + 1; }
  void read(Split split, int64_t begin, int64_t count, int64_t* out) const override {
    const std::string what = "dataset '" + name_ + "'";
    if (count != seq_len_ + 1 || begin % seq_len_ != 0)
      throw UserError(what + " was made for samples of seq_len " + std::to_string(seq_len_) + " (+1 target) tokens, but the job reads " +
                      std::to_string(count) + " tokens at offset " + std::to_string(begin) + ": set [model] seq_len = " +
                      std::to_string(seq_len_));
    const int64_t index = begin / seq_len_;
    const std::string where = what + " sample " + std::to_string(index) + (split == Split::Train ? " (train)" : " (validation)");
    const at::Tensor tokens = sample_(split, index);
    if (!tokens.defined() || tokens.dim() != 1 || tokens.numel() != count || at::isFloatingType(tokens.scalar_type()))
      throw UserError(where + ": the callback must return a 1-D integer tensor of seq_len + 1 = " + std::to_string(count) + " tokens");
    const at::Tensor stream = tokens.to(at::kCPU, at::kLong).contiguous();
    if (stream.min().item<int64_t>() < 0 || stream.max().item<int64_t>() >= vocab_size_)
      throw UserError(where + ": tokens must lie in [0, " + std::to_string(vocab_size_) + ")");
    std::copy_n(stream.data_ptr<int64_t>(), count, out);
  }

 private:
  std::string name_;
  int64_t vocab_size_, seq_len_, train_, validation_;
  SampleFn sample_;
};

class SampleDatasetFactory final : public DatasetFactory {
 public:
  SampleDatasetFactory(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train, int64_t validation, SampleFn sample)
      : DatasetFactory({ComponentKind::Dataset, std::move(name), "samples produced by the program, by index", Schema()}),
        vocab_size_(vocab_size), seq_len_(seq_len), train_(train), validation_(validation), sample_(std::move(sample)) {
    if (vocab_size < 1 || seq_len < 1 || train < 1 || validation < 1 || !sample_)
      throw UserError("dataset '" + this->name() + "': needs vocab_size, seq_len and at least one train and one validation sample, and a callback");
  }
  std::unique_ptr<TokenDataset> open(const Config&, const DataContext&) const override {
    return std::make_unique<SampleTokens>(name(), vocab_size_, seq_len_, train_, validation_, sample_);
  }

 private:
  int64_t vocab_size_, seq_len_, train_, validation_;
  SampleFn sample_;
};

}  // namespace

std::unique_ptr<DatasetFactory> sample_dataset(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train_samples,
                                               int64_t validation_samples, SampleFn sample) {
  return std::make_unique<SampleDatasetFactory>(std::move(name), vocab_size, seq_len, train_samples, validation_samples, std::move(sample));
}

}  // namespace strata
