// strata sample: a checkpoint's model continues a prompt, for a look at what a run learned without
// leaving Strata.
//
// The model is loaded whole in this process from any layout (load_checkpoint_model; the export
// fills one parameter at a time instead) and runs autoregressively on the CPU: each new token
// recomputes the window of the last tokens of the context the model is made for (no key/value cache: a sample is short and the
// models Strata trains on a CPU are small). That context is [model] max_positions where the model
// has that key and it is set (what the export's config.json states, so transformers' generate sees
// the same window), else seq_len. The next token is the argmax at temperature 0; otherwise it is drawn from the softmax of
// logits / temperature restricted to the top_k likeliest tokens, with a generator seeded by the
// user, so one seed gives one text. Byte-level runs only: the text dataset's token id is the byte,
// so the prompt's UTF-8 bytes are its ids and the continuation's ids are bytes of text. A model
// may emit bytes that are not UTF-8 (half a character, a stray continuation byte): the text is
// decoded as transformers' byte-level tokenizer decodes the export's ids (Rust's from_utf8_lossy,
// Python's errors="replace"), each maximal invalid subpart one U+FFFD, so a terminal never gets
// raw invalid bytes and `strata sample` prints what transformers prints.
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

// How many bytes of `bytes` from `at` form one valid UTF-8 character (Unicode 15, table 3-7), or
// the negated length of its maximal invalid subpart (at least 1).
int64_t utf8_character(std::string_view bytes, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  int64_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range, narrowed where table 3-7 does
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF) length = 3, low = lead == 0xE0 ? 0xA0 : 0x80, high = lead == 0xED ? 0x9F : 0xBF;
  else if (lead >= 0xF0 && lead <= 0xF4) length = 4, low = lead == 0xF0 ? 0x90 : 0x80, high = lead == 0xF4 ? 0x8F : 0xBF;
  else return -1;
  for (int64_t k = 1; k < length; ++k) {
    if (at + k >= bytes.size()) return -k;
    const unsigned char next = byte(at + k);
    if (k == 1 ? (next < low || next > high) : (next < 0x80 || next > 0xBF)) return -k;
  }
  return length;
}

}  // namespace

std::string utf8_or_replacement(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (size_t at = 0; at < bytes.size();) {
    const int64_t n = utf8_character(bytes, at);
    if (n > 0) text.append(bytes.substr(at, n));
    else text.append("\xEF\xBF\xBD");  // U+FFFD
    at += static_cast<size_t>(n > 0 ? n : -n);
  }
  return text;
}

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
  return utf8_or_replacement(std::string(ids.begin(), ids.end()));
}

std::string sample_text(const std::filesystem::path& source, const SampleOptions& options, const ComponentRegistry& registry) {
  check_options(options);
  if (options.prompt.empty()) throw UserError("--prompt is empty: give the text to continue");
  CheckpointModel loaded = load_checkpoint_model(source, registry);
  return sample_text(loaded, options);
}

}  // namespace strata
