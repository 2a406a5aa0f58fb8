// Model factories: GPT-2, Llama and Mixtral architectures, configured by [model].
#include "models.h"
#include "moe_layer.h"

#include <cstdio>
#include <map>

namespace strata::models {

void check_heads(const Config& config, const SourcePos& section, Diagnostics& diagnostics) {
  if (config.get_int("d_model") % config.get_int("n_head") != 0)
    diagnostics.error(section, "[model] d_model (" + std::to_string(config.get_int("d_model")) +
                                   ") must be divisible by n_head (" + std::to_string(config.get_int("n_head")) + ")");
}

Schema& add_sliding_window(Schema& schema) {
  return schema.integer("sliding_window", 0,
                        "Each token attends to its N most recent tokens, itself included (Mistral's sliding window); 0 = all earlier tokens",
                        between(0, 1 << 24));
}

Schema& add_max_positions(Schema& schema) {
  return schema.integer("max_positions", 0,
                        "The context the model is made for, stated in its export's config.json (GPT: its learned position table's rows, "
                        "of which training uses the first seq_len); 0 = seq_len",
                        between(0, 1 << 24));
}

int64_t max_positions(const Config& config) {
  return config.get_int("max_positions") > 0 ? config.get_int("max_positions") : config.get_int("seq_len");
}

void check_max_positions(const Config& config, Diagnostics& diagnostics) {
  const int64_t stated = config.get_int("max_positions"), seq_len = config.get_int("seq_len");
  if (stated > 0 && stated < seq_len)
    diagnostics.error(config.entry("max_positions").pos, "[model] max_positions = " + std::to_string(stated) + " is less than seq_len = " +
                                                             std::to_string(seq_len) + ", the context it trains on; set it >= " +
                                                             std::to_string(seq_len) + " (or 0: seq_len)");
}

void apply_sliding_window(nn::Model& model, const Config& config) {
  for (const auto& module : model.modules())
    if (auto* core = dynamic_cast<nn::AttentionCore*>(module.get())) core->sliding_window = config.get_int("sliding_window");
}

void require_no_sliding_window(const Config& config, const std::string& hf_architecture) {
  if (config.get_int("sliding_window") > 0)
    throw UserError(hf_architecture + " has no sliding window; a [model] sliding_window = " + std::to_string(config.get_int("sliding_window")) +
                    " model cannot be exported as one");
}

NamedTensors map_to_hf(const nn::Model& model, ToHfName to_hf_name) {
  NamedTensors out;
  for (const auto& p : model.named_parameters()) {
    HfName hf = to_hf_name(p.key());
    // Views, transposed ones too: the writer lays each out as it writes it, so an export holds
    // the model and one tensor's copy, not a second model.
    out.emplace_back(hf.name, hf.transposed ? p.value().detach().t() : p.value().detach());
  }
  return out;
}

std::shared_ptr<nn::Model> whole_model(const ModelFactory& factory, const Config& config) {
  Config random_init = config;
  random_init.set("init_from", Config::Entry{std::string(), Origin::Default, {}});
  // A pipeline rank builds only its stages (under a BlockFilter); a checkpoint names every
  // block's tensors, so the names come from the whole model.
  const nn::BlockFilter every_block([](size_t) { return true; });
  return factory.create(random_init);
}

NamedTensors map_from_hf(const NamedTensors& given, const nn::Model& shape_donor, const HfLayout& layout) {
  NamedTensors named = given;
  if (lacks_base_prefix(layout, given))  // a base-model checkpoint
    for (auto& [name, tensor] : named) name = layout.base_prefix + name;
  const NamedTensors hf = layout.experts > 0 ? stacked_from_hub_experts(named, layout.experts) : named;
  const auto find = [&hf](const char* name) -> const at::Tensor* {
    for (const auto& [n, tensor] : hf)
      if (name && n == name) return &tensor;
    return nullptr;
  };
  require_tied_copy_equal(layout, find(layout.tied_copy), find(layout.tied_original), "the checkpoint");
  std::map<std::string, std::pair<std::string, bool>> strata_of;  // hf name -> strata name, transposed
  std::map<std::string, int64_t> rows;                              // strata name -> the model's rows
  for (const auto& p : shape_donor.named_parameters()) {
    HfName name = layout.to_hf_name(p.key());
    strata_of[name.name] = {p.key(), name.transposed};
    rows[p.key()] = p.value().dim() > 0 ? p.value().size(0) : 0;
  }
  NamedTensors out;
  for (const auto& [name, tensor] : hf) {
    auto it = strata_of.find(name);
    if (it == strata_of.end()) {
      if (layout.ignored(name)) continue;
      throw UserError("Hugging Face tensor '" + name + "' has no place in this model; check [model] against the checkpoint's config.json");
    }
    if (it->second.second && tensor.dim() != 2)
      throw UserError("Hugging Face tensor '" + name + "' is a Conv1D weight and must be 2-D, but has shape " + c10::str(tensor.sizes()));
    const std::string& strata_name = it->second.first;
    out.emplace_back(strata_name, it->second.second ? tensor.t().contiguous() : leading_rows_of(layout, strata_name, tensor, rows[strata_name]));
  }
  return out;
}

std::string json_number(double value) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return buf;
}

namespace {
void register_components(Registry& registry) {
  registry.add(make_gpt());
  registry.add(make_llama());
  registry.add(make_mixtral());
}
}  // namespace

std::string vocab_line(int64_t vocab, int64_t parts) {
  if (vocab % parts == 0) return "vocabulary: " + std::to_string(vocab / parts) + " of " + std::to_string(vocab) + " rows per rank";
  const nn::ShardRange first = nn::shard_range(vocab, {parts, 0}), last = nn::shard_range(vocab, {parts, parts - 1});
  return "vocabulary: " + std::to_string(first.size) + " or " + std::to_string(last.size) + " of " + std::to_string(vocab) +
         " rows per rank (split unevenly, no padding rows)";
}

}  // namespace strata::models

STRATA_PLUGIN("models", "0.2.0", strata::models::register_components)
