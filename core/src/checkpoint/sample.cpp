// strata sample: a checkpoint's model continues a prompt, for a look at what a run learned without
// leaving Strata.
//
// The model is loaded whole in this process from any layout (load_checkpoint_model, as export
// does) and runs autoregressively on the CPU: each new token recomputes the window of the last
// tokens of the context the model is made for (no key/value cache: a sample is short and the
// models Strata trains on a CPU are small). That context is [model] max_positions where the model
// has that key and it is set (what the export's config.json states, so transformers' generate sees
// the same window), else seq_len. The next token is the argmax at temperature 0; otherwise it is drawn from the softmax of
// logits / temperature restricted to the top_k likeliest tokens, with a generator seeded by the
// user, so one seed gives one text. Byte-level runs only: the text dataset's token id is the byte,
// so the prompt's UTF-8 bytes are its ids and the continuation's ids are bytes of text.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "strata/core/trainer.h"
#include "strata/errors.h"

namespace strata {

namespace {

void check_options(const SampleOptions& options) {
  if (options.tokens < 0) throw UserError("--tokens must be 0 or more, got " + std::to_string(options.tokens));
  if (!(options.temperature >= 0)) throw UserError("--temperature must be 0 (greedy) or more");
  if (options.top_k < 0) throw UserError("--top-k must be 0 (all tokens) or more");
}

}  // namespace

std::vector<int64_t> continue_tokens(CheckpointModel& loaded, std::vector<int64_t> ids, const SampleOptions& options) {
  check_options(options);
  nn::Model& model = *loaded.model;
  model.eval();
  const torch::NoGradGuard no_grad;
  const int64_t window = model_context(loaded.plan.model, model.seq_len());
  at::Generator generator = at::detail::createCPUGenerator(options.seed);
  for (int64_t n = 0; n < options.tokens; ++n) {
    const int64_t first = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - window);
    const at::Tensor context = at::tensor(std::vector<int64_t>(ids.begin() + first, ids.end()), at::kLong).unsqueeze(0);
    at::Tensor logits = model.forward(context).select(1, context.size(1) - 1).squeeze(0).to(at::kDouble);
    int64_t next = 0;
    if (options.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        const at::Tensor kth = std::get<0>(logits.topk(options.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      next = at::multinomial(at::softmax(logits, 0), 1, /*replacement=*/false, generator).item<int64_t>();
    }
    ids.push_back(next);
  }
  return ids;
}

std::string sample_text(CheckpointModel& loaded, const SampleOptions& options) {
  check_options(options);
  if (options.prompt.empty()) throw UserError("--prompt is empty: give the text to continue");
  const std::string dataset = loaded.plan.dataset_component ? loaded.plan.dataset_component->name() : "";
  if (dataset != "text")
    throw UserError("strata sample reads byte-level runs (the text dataset) and runs on token files strata data prepare wrote; this "
                    "run trained on the '" + dataset + "' dataset, whose tokenizer Strata does not know: export it (strata ckpt "
                    "export) and sample with transformers and its tokenizer");
  std::vector<int64_t> ids(options.prompt.begin(), options.prompt.end());
  for (int64_t& id : ids) id = static_cast<unsigned char>(id);
  ids = continue_tokens(loaded, std::move(ids), options);
  return std::string(ids.begin(), ids.end());
}

std::string sample_text(const std::filesystem::path& source, const SampleOptions& options, const ComponentRegistry& registry) {
  check_options(options);
  if (options.prompt.empty()) throw UserError("--prompt is empty: give the text to continue");
  CheckpointModel loaded = load_checkpoint_model(source, registry);
  return sample_text(loaded, options);
}

}  // namespace strata
