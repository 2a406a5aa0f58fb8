// Whether layers draw their initial weights. A model built only to have every parameter
// overwritten (load_checkpoint_model: strata ckpt export, strata sample) skips the draws: normal_
// over every weight was 18% of exporting GPT-2 124M. While a SkipInitialDraws is alive on this
// thread, Linear, Embedding and GroupedLinear leave their weights uninitialised (at::empty);
// a factory's own draws are unaffected. Whoever opens one must fill every parameter.
#pragma once

namespace strata::nn {

class SkipInitialDraws {
 public:
  SkipInitialDraws();
  ~SkipInitialDraws();
  SkipInitialDraws(const SkipInitialDraws&) = delete;
  SkipInitialDraws& operator=(const SkipInitialDraws&) = delete;

 private:
  bool outer_;
};

bool initial_draws_skipped();

}  // namespace strata::nn
