// The model factories this plugin registers.
#pragma once

#include <memory>

#include "init_from.h"
#include "strata/interchange.h"
#include "strata/plugin.h"

namespace strata::models {

std::unique_ptr<ModelFactory> make_gpt();
std::unique_ptr<ModelFactory> make_llama();
std::unique_ptr<ModelFactory> make_mixtral();

// d_model must split evenly into heads.
void check_heads(const Config& config, const SourcePos& section, Diagnostics& diagnostics);

// [model] sliding_window, the same key in every model: each token attends to its N most recent
// tokens, itself included (Mistral's sliding-window attention); 0, the default, to all earlier ones.
Schema& add_sliding_window(Schema& schema);
// Sets every attention of `model` to the configured window.
void apply_sliding_window(nn::Model& model, const Config& config);
// Hugging Face's GPT2LMHeadModel and LlamaForCausalLM have no sliding window: exporting a windowed
// model as one would silently change what it computes. (Importing weights into one is a choice.)
void require_no_sliding_window(const Config& config, const std::string& hf_architecture);

// [model] max_positions, the same key in every model: the context the model is made for, which its
// export's config.json states (n_positions, max_position_embeddings) and servers take as the
// longest prompt; GPT's learned position table has that many rows, of which training uses the
// first seq_len. 0, the default: seq_len. A Hugging Face checkpoint's value is kept by stating it.
Schema& add_max_positions(Schema& schema);
int64_t max_positions(const Config& config);
// max_positions is 0 or at least seq_len.
void check_max_positions(const Config& config, Diagnostics& diagnostics);

// Maps parameter names (and layouts) both ways with the factory's HfLayout (init_from.h): to_hf
// for export, from_hf for a checkpoint given whole (init_from loads block by block instead).
NamedTensors map_to_hf(const nn::Model& model, ToHfName to_hf_name);
// The whole model `factory` builds from `config` with random weights and no init_from, also on a
// pipeline rank that builds only its stages: the names and shapes from_hf maps a checkpoint to.
std::shared_ptr<nn::Model> whole_model(const ModelFactory& factory, const Config& config);
NamedTensors map_from_hf(const NamedTensors& hf, const nn::Model& shape_donor, const HfLayout& layout);
std::string json_number(double value);
// "vocabulary: V/t rows per rank", or the uneven rows when t does not divide V.
std::string vocab_line(int64_t vocab, int64_t parts);

}  // namespace strata::models
