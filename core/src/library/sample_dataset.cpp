// Datasets the program produces sample by sample (strata/accelerate.h): sample_dataset, the
// map-style dataset of PyTorch (__getitem__ by index), and stream_dataset, the iterable-style one
// (__iter__), in Strata's terms. Core's sampler reads whole windows of seq_len + 1 tokens at token
// offsets window x seq_len, so window w is sample w: the sampler's shuffle, resume position and
// elastic restarts address samples by index. A map-style callback serves any index, so all of it
// stays exact as long as the callback is a pure function of (split, index). A stream serves them
// in order: reading sample w advances the split's stream to w, dropping what lies between, and an
// earlier sample starts the stream again (a resume, each evaluation, a new epoch), so positions
// stay exact as long as the stream gives the same samples each time it starts; shuffling, which
// would start it again for almost every sample, is refused by the sampler (read_in_order).
#include <functional>
#include <mutex>
#include <string>

#include <ATen/ATen.h>

#include "strata/accelerate.h"
#include "strata/errors.h"

namespace strata {

namespace {

// Samples addressed by index: the window's index, checked, and the sample's tokens copied out.
class ProgramSamples : public TokenDataset {
 public:
  ProgramSamples(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train, int64_t validation)
      : name_(std::move(name)), vocab_size_(vocab_size), seq_len_(seq_len), train_(train), validation_(validation) {}
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
    const at::Tensor tokens = sample(split, index, where);
    if (!tokens.defined() || tokens.dim() != 1 || tokens.numel() != count || at::isFloatingType(tokens.scalar_type()))
      throw UserError(where + ": the callback must return a 1-D integer tensor of seq_len + 1 = " + std::to_string(count) + " tokens");
    const at::Tensor stream = tokens.to(at::kCPU, at::kLong).contiguous();
    if (stream.min().item<int64_t>() < 0 || stream.max().item<int64_t>() >= vocab_size_)
      throw UserError(where + ": tokens must lie in [0, " + std::to_string(vocab_size_) + ")");
    std::copy_n(stream.data_ptr<int64_t>(), count, out);
  }

 protected:
  virtual at::Tensor sample(Split split, int64_t index, const std::string& where) const = 0;

 private:
  std::string name_;
  int64_t vocab_size_, seq_len_, train_, validation_;
};

class SampleTokens final : public ProgramSamples {
 public:
  SampleTokens(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train, int64_t validation, SampleFn sample)
      : ProgramSamples(std::move(name), vocab_size, seq_len, train, validation), sample_(std::move(sample)) {}

 private:
  at::Tensor sample(Split split, int64_t index, const std::string&) const override { return sample_(split, index); }
  SampleFn sample_;
};

class StreamTokens final : public ProgramSamples {
 public:
  StreamTokens(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train, int64_t validation, StreamFn open)
      : ProgramSamples(std::move(name), vocab_size, seq_len, train, validation), open_(std::move(open)) {}
  bool read_in_order() const override { return true; }

 private:
  struct Reader {
    std::mutex mutex;
    std::function<at::Tensor()> next;
    int64_t position = 0;  // the index of the sample next() gives
  };
  at::Tensor sample(Split split, int64_t index, const std::string& where) const override {
    Reader& reader = split == Split::Train ? train_ : validation_;
    std::lock_guard lock(reader.mutex);
    if (!reader.next || index < reader.position) {
      reader.next = open_(split);
      reader.position = 0;
      if (!reader.next) throw UserError(where + ": the stream callback returned no generator");
    }
    for (;; ++reader.position) {
      at::Tensor tokens = reader.next();
      if (!tokens.defined())
        throw UserError(where + ": the stream ended after " + std::to_string(reader.position) + " samples");
      if (reader.position == index) {
        ++reader.position;
        return tokens;
      }
    }
  }
  StreamFn open_;
  mutable Reader train_, validation_;
};

// The factory of either kind: every open() gives a fresh reader of the program's callback.
class ProgramDatasetFactory final : public DatasetFactory {
 public:
  using Make = std::function<std::unique_ptr<TokenDataset>(const std::string& name)>;
  ProgramDatasetFactory(std::string name, std::string description, bool complete, Make make)
      : DatasetFactory({ComponentKind::Dataset, std::move(name), std::move(description), Schema()}), make_(std::move(make)) {
    if (!complete)
      throw UserError("dataset '" + this->name() + "': needs vocab_size, seq_len and at least one train and one validation sample, and a callback");
  }
  std::unique_ptr<TokenDataset> open(const Config&, const DataContext&) const override { return make_(name()); }

 private:
  Make make_;
};

bool complete(int64_t vocab_size, int64_t seq_len, int64_t train, int64_t validation, bool callback) {
  return vocab_size >= 1 && seq_len >= 1 && train >= 1 && validation >= 1 && callback;
}

}  // namespace

std::unique_ptr<DatasetFactory> stream_dataset(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train_samples,
                                               int64_t validation_samples, StreamFn open) {
  const bool ok = complete(vocab_size, seq_len, train_samples, validation_samples, static_cast<bool>(open));
  return std::make_unique<ProgramDatasetFactory>(std::move(name), "samples produced by the program, as a stream", ok, [=](const std::string& n) {
    return std::make_unique<StreamTokens>(n, vocab_size, seq_len, train_samples, validation_samples, open);
  });
}

std::unique_ptr<DatasetFactory> sample_dataset(std::string name, int64_t vocab_size, int64_t seq_len, int64_t train_samples,
                                               int64_t validation_samples, SampleFn sample) {
  const bool ok = complete(vocab_size, seq_len, train_samples, validation_samples, static_cast<bool>(sample));
  return std::make_unique<ProgramDatasetFactory>(std::move(name), "samples produced by the program, by index", ok, [=](const std::string& n) {
    return std::make_unique<SampleTokens>(n, vocab_size, seq_len, train_samples, validation_samples, sample);
  });
}

}  // namespace strata
