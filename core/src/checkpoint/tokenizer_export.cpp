#include "tokenizer_export.h"

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "strata/core/prepared_data.h"
#include "strata/errors.h"

namespace strata {

namespace {

using json = nlohmann::ordered_json;

// The byte-level pre-tokenizer and decoder: bytes to the alphabet and back, no splitting.
json byte_level() { return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}; }

void write_json(const std::filesystem::path& path, const json& j) { engine::write_text_durably(path, j.dump(2) + "\n"); }

}  // namespace

std::string byte_as_character(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int code_point = b;
  if (!printable) {
    int n = 0;  // the non-printable bytes below b
    for (int c = 0; c < b; ++c)
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) ++n;
    code_point = 256 + n;
  }
  std::string utf8;  // code points below 0x800: one or two bytes
  if (code_point < 0x80) utf8 += static_cast<char>(code_point);
  else {
    utf8 += static_cast<char>(0xC0 | (code_point >> 6));
    utf8 += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return utf8;
}

void write_byte_level_tokenizer(const std::filesystem::path& out, int64_t model_max_length, std::optional<int64_t> eos) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_as_character(b)] = b;
  const json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level()},
      {"post_processor", nullptr},
      {"decoder", byte_level()},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", json::array()}}}};
  write_json(out / "tokenizer.json", tokenizer);
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"model_max_length", model_max_length},
                 {"clean_up_tokenization_spaces", false}};
  if (eos) config["eos_token"] = byte_as_character(static_cast<int>(*eos));
  write_json(out / "tokenizer_config.json", config);
}

bool copy_prepared_tokenizer(const std::filesystem::path& out, const std::filesystem::path& data_dir, int64_t model_max_length) {
  const std::optional<PreparedData> prepared = read_prepared_data(data_dir);
  if (!prepared || prepared->tokenizer.empty() || !prepared->eos_token) return false;
  {  // read whole and written durably, as the files beside it
    std::ifstream in(prepared->tokenizer, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) throw UserError("cannot read " + prepared->tokenizer.string());
    engine::write_text_durably(out / "tokenizer.json", text.str());
  }
  const std::string eos = *prepared->eos_token;
  write_json(out / "tokenizer_config.json", {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                             {"model_max_length", model_max_length},
                                             {"clean_up_tokenization_spaces", false},
                                             {"bos_token", eos},
                                             {"eos_token", eos}});
  return true;
}

void complete_hf_config(const std::filesystem::path& config_json, std::optional<int64_t> eos, at::ScalarType dtype) {
  json config;
  {
    std::ifstream f(config_json);
    config = json::parse(f);
  }
  const int64_t vocab = config.value("vocab_size", int64_t{0});
  if (eos && (*eos < 0 || *eos >= vocab)) eos.reset();
  config["bos_token_id"] = eos ? json(*eos) : json(nullptr);
  config["eos_token_id"] = eos ? json(*eos) : json(nullptr);
  config["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  write_json(config_json, config);
}

}  // namespace strata
