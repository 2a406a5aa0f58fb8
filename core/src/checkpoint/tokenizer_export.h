// The tokenizer an export carries, in Hugging Face's formats (tokenizer.json for the `tokenizers`
// library, tokenizer_config.json for transformers' AutoTokenizer), and the special-token ids
// config.json states.
//
// A run on the `text` dataset trains on bytes: token id = byte value, vocabulary 256. Its
// tokenizer is byte-level BPE without merges, GPT-2's byte-to-unicode alphabet as the vocabulary
// (the printable Latin-1 bytes stand for themselves, the other 68 bytes for the code points from
// U+0100 on, in byte order), no pre-tokenizer splitting, and the byte-level decoder: any UTF-8
// text encodes to exactly its bytes and decodes back. A byte vocabulary has no special tokens, so
// bos and eos are null (generation stops at max_new_tokens) unless [data] document_end names the
// byte that ends a document, which is then eos.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

namespace strata {

// GPT-2's byte-to-unicode table: byte b as the character the byte-level vocabulary spells it with
// (the token of id b in a byte-level run's tokenizer.json).
std::string byte_as_character(int b);

// Writes tokenizer.json and tokenizer_config.json into `out` for a byte-level run.
void write_byte_level_tokenizer(const std::filesystem::path& out, int64_t model_max_length, std::optional<int64_t> eos);

// A run on token files `strata data prepare` wrote: their directory's tokenizer.json, copied, and a
// tokenizer_config.json naming meta.json's end-of-text token as bos and eos (GPT-2's convention).
// False, writing nothing, when `data_dir` holds no prepared tokenizer.
bool copy_prepared_tokenizer(const std::filesystem::path& out, const std::filesystem::path& data_dir, int64_t model_max_length);

// Completes `out`/config.json: bos_token_id and eos_token_id set to `eos` (both, as GPT-2's do),
// or to null where the run has no such token (an id the vocabulary lacks is never written), and
// torch_dtype to the dtype the weights were written in ("bfloat16", "float32", ...), which
// transformers' from_pretrained(dtype="auto") loads them as.
void complete_hf_config(const std::filesystem::path& config_json, std::optional<int64_t> eos, at::ScalarType dtype);

}  // namespace strata
