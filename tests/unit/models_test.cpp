// The bundled GPT, Llama and Mixtral models: shapes, gradients, parameter naming, and learning.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include <unistd.h>

#include "bundled_plugins.h"
#include "strata/errors.h"
#include "strata/interchange.h"
#include "strata/core/safetensors.h"
#include "strata/model.h"
#include "strata/optimizer.h"
#include "strata/ops.h"

namespace strata {
namespace {

using test::bundled;
using test::config_for;

std::shared_ptr<nn::Model> make(const std::string& name, const std::map<std::string, Value>& values) {
  const auto* factory = dynamic_cast<const ModelFactory*>(bundled().find(ComponentKind::Model, name));
  EXPECT_NE(factory, nullptr);
  return factory->create(config_for(*factory, values));
}

std::map<std::string, Value> tiny(const std::string& name) {
  std::map<std::string, Value> v{{"n_layer", int64_t{2}}, {"n_head", int64_t{4}}, {"d_model", int64_t{32}},
                                 {"vocab_size", int64_t{64}}, {"seq_len", int64_t{16}}};
  if (name == "llama" || name == "mixtral") v["n_kv_head"] = int64_t{2};
  if (name == "mixtral") v["n_experts"] = int64_t{4};
  return v;
}

double train_on_one_batch(nn::Model& model, int steps) {
  at::manual_seed(1);
  at::Tensor batch = at::randint(model.vocab_size(), {4, model.seq_len() + 1}, at::kLong);
  at::Tensor x = batch.narrow(1, 0, model.seq_len()), y = batch.narrow(1, 1, model.seq_len());
  const auto* adamw = dynamic_cast<const OptimizerFactory*>(bundled().find(ComponentKind::Optimizer, "adamw"));
  ParamGroup group;
  for (const auto& p : model.named_parameters()) group.names.push_back(p.key()), group.params.push_back(p.value());
  auto optimizer = adamw->create({group}, config_for(*adamw, {}));
  double loss = 0;
  for (int i = 0; i < steps; ++i) {
    for (auto& p : group.params) p.mutable_grad() = at::Tensor();
    at::Tensor l = ops::cross_entropy(model.forward(x).reshape({-1, model.vocab_size()}), y.reshape(-1));
    l.backward();
    optimizer->step(3e-3);
    loss = l.item<double>();
  }
  return loss;
}

class Models : public ::testing::TestWithParam<std::string> {};

TEST_P(Models, ForwardBackwardShapesAndGradients) {
  at::manual_seed(0);
  auto model = make(GetParam(), tiny(GetParam()));
  ASSERT_EQ(model->num_blocks(), 4u);  // embedding, 2 blocks, head
  EXPECT_EQ(model->block(0).type(), "embedding");
  EXPECT_EQ(model->find_blocks({"block"}).size(), 2u);
  at::Tensor tokens = at::randint(64, {3, 16}, at::kLong);
  at::Tensor logits = model->forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 16, 64}));
  logits.sum().backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(at::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
}

TEST_P(Models, LossFallsOnATinyRun) {
  auto model = make(GetParam(), tiny(GetParam()));
  const double first = train_on_one_batch(*model, 1);
  auto again = make(GetParam(), tiny(GetParam()));
  const double later = train_on_one_batch(*again, 40);
  EXPECT_LT(later, first * 0.6) << "first " << first << ", after 40 steps " << later;
}

TEST_P(Models, CausalityHolds) {
  at::manual_seed(0);
  auto model = make(GetParam(), tiny(GetParam()));
  model->eval();
  at::Tensor a = at::randint(64, {1, 16}, at::kLong), b = a.clone();
  b[0][10] = (b[0][10].item<int64_t>() + 1) % 64;
  at::Tensor la = model->forward(a), lb = model->forward(b);
  EXPECT_TRUE(at::allclose(la.narrow(1, 0, 10), lb.narrow(1, 0, 10), 1e-5, 1e-5));
  EXPECT_FALSE(at::allclose(la.narrow(1, 10, 6), lb.narrow(1, 10, 6)));
}

// What strata tune's cost model reads without building the model is what building it gives.
TEST_P(Models, ShapeCountsTheParametersWithoutBuilding) {
  const auto* factory = dynamic_cast<const ModelFactory*>(bundled().find(ComponentKind::Model, GetParam()));
  std::vector<std::map<std::string, Value>> variants{tiny(GetParam())};
  auto other = tiny(GetParam());
  other["n_layer"] = int64_t{3}, other["seq_len"] = int64_t{24}, other["vocab_size"] = int64_t{70};
  if (GetParam() == "gpt") other["bias"] = false;
  if (GetParam() == "llama")
    other["tie_embeddings"] = true, other["n_kv_head"] = int64_t{1}, other["ffn_hidden"] = int64_t{40}, other["qkv_bias"] = true;
  variants.push_back(other);
  for (const auto& values : variants) {
    const Config config = config_for(*factory, values);
    const ModelShape shape = factory->shape(config);
    int64_t built = 0, layer = 0;
    auto model = factory->create(config);
    for (const auto& p : model->parameters()) built += p.numel();
    for (const auto& p : model->block(model->find_blocks({"block"}).front()).parameters()) layer += p.numel();
    EXPECT_EQ(shape.parameters, built);
    EXPECT_EQ(shape.layer_parameters, layer);
    EXPECT_EQ(shape.layers, config.get_int("n_layer"));
    EXPECT_EQ(shape.seq_len, config.get_int("seq_len"));
  }
}

// A pipeline rank builds only its blocks (nn::BlockFilter): those hold exactly the whole model's
// values, the others are absent (no parameters, their counts and ties remembered), and the
// generator ends where building the whole model leaves it.
TEST_P(Models, BlockFilterKeepsTheWholeModelsValuesOfItsBlocks) {
  const auto* factory = dynamic_cast<const ModelFactory*>(bundled().find(ComponentKind::Model, GetParam()));
  const Config config = config_for(*factory, tiny(GetParam()));
  at::manual_seed(7);
  const auto whole = factory->create(config);
  const double next_whole = at::rand({1}).item<double>();
  at::manual_seed(7);
  std::shared_ptr<nn::Model> part;
  {
    const nn::BlockFilter filter([](size_t b) { return b == 1 || b == 3; });
    part = factory->create(config);
  }
  EXPECT_EQ(at::rand({1}).item<double>(), next_whole);
  ASSERT_EQ(part->num_blocks(), whole->num_blocks());
  auto whole_params = whole->named_parameters();
  for (size_t b = 0; b < part->num_blocks(); ++b) {
    EXPECT_EQ(part->block_name(b), whole->block_name(b));
    EXPECT_EQ(part->block(b).type(), whole->block(b).type());
    EXPECT_EQ(nn::block_parameter_count(*part, b), nn::block_parameter_count(*whole, b)) << part->block_name(b);
    EXPECT_EQ(nn::block_reads_tied_weight(*part, b), nn::block_reads_tied_weight(*whole, b)) << part->block_name(b);
    const bool absent = dynamic_cast<const nn::AbsentBlock*>(&part->block(b)) != nullptr;
    EXPECT_EQ(absent, b != 1 && b != 3) << part->block_name(b);
    if (absent) EXPECT_TRUE(part->block(b).parameters().empty());
  }
  int64_t kept = 0;
  for (const auto& p : part->named_parameters()) {
    ASSERT_TRUE(whole_params.contains(p.key())) << p.key();
    EXPECT_TRUE(at::equal(p.value(), whole_params[p.key()])) << p.key();
    ++kept;
  }
  EXPECT_GT(kept, 0);
  EXPECT_THROW(part->block(0).forward(at::zeros({1, 2}, at::kLong)), std::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Bundled, Models, ::testing::Values("gpt", "llama", "mixtral"));

TEST(Gpt, TiedHeadIsOneParameterAndOnlyLinearWeightsDecay) {
  auto model = make("gpt", tiny("gpt"));
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  EXPECT_NE(std::find(names.begin(), names.end(), "embed.wte.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "h0.attn.c_attn.weight"), names.end());
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](auto& n) { return n.rfind("head.", 0) == 0; }), 2);  // ln_f only
  auto decayed = model->decayed_parameter_names();
  EXPECT_EQ(decayed.size(), 8u);  // 4 Linear weights per block
  for (const auto& n : decayed) EXPECT_NE(n.find("weight"), std::string::npos) << n;
}

TEST(Llama, GroupedQueryAttentionShapes) {
  auto model = make("llama", tiny("llama"));
  for (const auto& p : model->named_parameters())
    if (p.key() == "layers0.self_attn.k_proj.weight") EXPECT_EQ(p.value().sizes(), (std::vector<int64_t>{16, 32}));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

const ModelFactory& factory(const std::string& name) {
  return *dynamic_cast<const ModelFactory*>(bundled().find(ComponentKind::Model, name));
}

TEST_P(Models, HuggingFaceExportImportRoundTrip) {
  const std::string name = GetParam();
  at::manual_seed(3);
  auto original = make(name, tiny(name));
  Config config = config_for(factory(name), tiny(name));
  NamedTensors hf = factory(name).to_hf(*original, config);
  at::manual_seed(4);
  auto copy = make(name, tiny(name));
  load_parameters(*copy, factory(name).from_hf(hf, config), "round trip");
  at::Tensor tokens = at::randint(64, {2, 16}, at::kLong);
  original->eval();
  copy->eval();
  EXPECT_TRUE(at::equal(original->forward(tokens), copy->forward(tokens)));
  // An unexpected tensor is refused by name.
  hf.emplace_back("model.something_else", at::zeros({1}));
  try {
    factory(name).from_hf(hf, config);
    FAIL() << "extra tensor accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.something_else' has no place in this model"), std::string::npos);
  }
}

// [model] init_from loads block by block (issue 58, sharded loading): from one mapped file and
// from a sharded index, the model gives the original's logits exactly; a keeper installed around
// the build (as fsdp's is) sees each block already loaded; a tensor with no place is refused.
TEST_P(Models, InitFromLoadsEachBlockAsItIsBuilt) {
  const std::string name = GetParam();
  at::manual_seed(3);
  auto original = make(name, tiny(name));
  original->eval();
  const Config config = config_for(factory(name), tiny(name));
  const NamedTensors hf = factory(name).to_hf(*original, config);
  const auto dir = std::filesystem::temp_directory_path() / ("strata_init_from_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "sharded");
  write_safetensors(dir / "model.safetensors", hf, {{"format", "pt"}});
  // The same tensors in two files with an index, as large checkpoints come.
  const size_t half = hf.size() / 2;
  write_safetensors(dir / "sharded" / "a.safetensors", NamedTensors(hf.begin(), hf.begin() + static_cast<long>(half)));
  write_safetensors(dir / "sharded" / "b.safetensors", NamedTensors(hf.begin() + static_cast<long>(half), hf.end()));
  {
    std::ofstream index(dir / "sharded" / "model.safetensors.index.json");
    index << "{\"weight_map\": {";
    for (size_t i = 0; i < hf.size(); ++i) index << (i ? ", " : "") << "\"" << hf[i].first << "\": \"" << (i < half ? "a" : "b") << ".safetensors\"";
    index << "}}";
  }
  const at::Tensor tokens = at::randint(64, {2, 16}, at::kLong);
  const at::Tensor expected = original->forward(tokens);

  // Records, for each block, whether its parameters already hold the original's values.
  struct Recorder : nn::BuildKeeper {
    const nn::Model* original;
    int loaded_blocks = 0;
    void built(size_t index, const std::string&, nn::Block& block) override {
      const auto mine = block.named_parameters(), theirs = original->block(index).named_parameters();
      bool same = mine.size() == theirs.size();
      for (const auto& p : mine) same = same && at::equal(p.value(), theirs[p.key()]);
      loaded_blocks += same;
    }
    std::string summary() const override { return {}; }
  } recorder;
  recorder.original = original.get();
  for (const auto& path : {dir / "model.safetensors", dir / "sharded"}) {
    auto settings = tiny(name);
    settings["init_from"] = path.string();
    at::manual_seed(4);
    std::shared_ptr<nn::Model> loaded;
    {
      const nn::KeepAtBuild around(&recorder);
      loaded = make(name, settings);
    }
    loaded->eval();
    EXPECT_TRUE(at::equal(loaded->forward(tokens), expected)) << path;
  }
  EXPECT_EQ(recorder.loaded_blocks, 2 * static_cast<int>(original->num_blocks()));

  NamedTensors extra = hf;
  extra.emplace_back("model.something_else", at::zeros({1}));
  write_safetensors(dir / "extra.safetensors", extra);
  auto settings = tiny(name);
  settings["init_from"] = (dir / "extra.safetensors").string();
  try {
    make(name, settings);
    ADD_FAILURE() << "extra tensor accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.something_else' has no place in this model"), std::string::npos) << e.what();
  }
  NamedTensors missing(hf.begin() + 1, hf.end());
  write_safetensors(dir / "missing.safetensors", missing);
  settings["init_from"] = (dir / "missing.safetensors").string();
  try {
    make(name, settings);
    ADD_FAILURE() << "missing tensor accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor '"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Hostile Hugging Face files (issue 21, items 2 and 4): a Conv1D weight that is not 2-D, integer
// weights and non-finite values are refused by name instead of converted or trained on.
TEST(Interchange, RefusesWeightsThatAreNotWeights) {
  at::manual_seed(3);
  auto model = make("gpt", tiny("gpt"));
  Config config = config_for(factory("gpt"), tiny("gpt"));
  NamedTensors hf = factory("gpt").to_hf(*model, config);
  // Both ways in: from_hf of whole tensors, and [model] init_from's block-by-block loading.
  const auto file = std::filesystem::temp_directory_path() / ("strata_hostile_" + std::to_string(::getpid()) + ".safetensors");
  auto error_with = [&](const std::string& hf_name, const at::Tensor& replacement) {
    NamedTensors changed = hf;
    for (auto& [name, tensor] : changed)
      if (name == hf_name) tensor = replacement;
    std::string messages;
    try {
      load_parameters(*make("gpt", tiny("gpt")), factory("gpt").from_hf(changed, config), "t");
      messages += "accepted";
    } catch (const UserError& e) {
      messages += e.what();
    }
    write_safetensors(file, changed);
    auto settings = tiny("gpt");
    settings["init_from"] = file.string();
    try {
      make("gpt", settings);
      messages += " | accepted";
    } catch (const UserError& e) {
      messages += std::string(" | ") + e.what();
    }
    std::filesystem::remove(file);
    return messages;
  };
  // The same refusal both ways.
  auto both = [](const std::string& messages, const std::string& wanted) {
    const size_t bar = messages.find(" | ");
    return messages.substr(0, bar).find(wanted) != std::string::npos && messages.substr(bar).find(wanted) != std::string::npos;
  };
  const std::string c_attn = "transformer.h.0.attn.c_attn.weight";
  at::Tensor original;
  for (const auto& [name, tensor] : hf)
    if (name == c_attn) original = tensor;
  EXPECT_PRED2(both, error_with(c_attn, original.unsqueeze(0)), "is a Conv1D weight and must be 2-D");
  EXPECT_PRED2(both, error_with(c_attn, original.to(at::kLong)), "is Long, not a floating-point dtype");
  EXPECT_PRED2(both, error_with(c_attn, original.to(at::kBool)), "is Bool, not a floating-point dtype");
  at::Tensor with_nan = original.clone(at::MemoryFormat::Contiguous);  // to_hf gives a transposed view
  with_nan.view(-1)[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_PRED2(both, error_with(c_attn, with_nan), "holds NaN or infinite values");
  EXPECT_EQ(error_with(c_attn, original.to(at::kBFloat16)), "accepted | accepted");  // float dtypes convert
}

// A tied model's output head is its embedding. A checkpoint may still store the head
// ("lm_head.weight"); a copy of the embedding loads, a head of other values (an untied model's)
// is refused both ways instead of dropped.
TEST(Interchange, TiedHeadMustCopyTheEmbedding) {
  for (const std::string name : {"gpt", "llama"}) {
    auto settings = tiny(name);
    if (name == "llama") settings["tie_embeddings"] = true;
    at::manual_seed(3);
    const Config config = config_for(factory(name), settings);
    const NamedTensors hf = factory(name).to_hf(*make(name, settings), config);
    const std::string embedding = name == "gpt" ? "transformer.wte.weight" : "model.embed_tokens.weight";
    at::Tensor embedding_values;
    for (const auto& [hf_name, tensor] : hf)
      if (hf_name == embedding) embedding_values = tensor;
    ASSERT_TRUE(embedding_values.defined()) << name;
    const auto file = std::filesystem::temp_directory_path() / ("strata_tied_" + std::to_string(::getpid()) + ".safetensors");
    auto outcome = [&](const at::Tensor& head) {
      NamedTensors with_head = hf;
      with_head.emplace_back("lm_head.weight", head);
      std::string messages;
      try {
        factory(name).from_hf(with_head, config);
        messages += "accepted";
      } catch (const UserError& e) {
        messages += e.what();
      }
      write_safetensors(file, with_head);
      auto from_file = settings;
      from_file["init_from"] = file.string();
      try {
        make(name, from_file);
        messages += " | accepted";
      } catch (const UserError& e) {
        messages += std::string(" | ") + e.what();
      }
      std::filesystem::remove(file);
      return messages;
    };
    EXPECT_EQ(outcome(embedding_values.clone()), "accepted | accepted") << name;
    const std::string refused = outcome(embedding_values + 1), wanted = "tensor 'lm_head.weight' is not a copy of '" + embedding + "'";
    const size_t first = refused.find(wanted);
    EXPECT_TRUE(first != std::string::npos && refused.find(wanted, first + 1) != std::string::npos) << refused;
    EXPECT_NE(refused.find("set [model] tie_embeddings = false to load both"), std::string::npos) << refused;
  }
}

// Writes tiny models in Hugging Face layout with tokens and Strata's logits, for
// tests/interop/transformers_parity.py to load with transformers and compare.
TEST(Interchange, WritesFilesForTransformers) {
  const char* dir = std::getenv("STRATA_HF_EXPORT_DIR");
  if (!dir) GTEST_SKIP() << "STRATA_HF_EXPORT_DIR not set";
  // Llama 3.1's rope scaling, its three bands of wavelengths within a 64-token pre-training
  // context (the tiny heads' wavelengths are 6.3, 63, 628 and 6283 tokens).
  std::map<std::string, Value> llama3 = tiny("llama");
  llama3["rope_scaling"] = std::string("llama3"), llama3["rope_factor"] = 32.0, llama3["rope_original_context"] = int64_t{64};
  // Qwen2: q/k/v biases, exported as Qwen2ForCausalLM.
  std::map<std::string, Value> qwen2 = tiny("llama");
  qwen2["qkv_bias"] = true;
  // Sliding windows shorter than the 16 tokens: Mistral (Llama's layers) and Mixtral.
  std::map<std::string, Value> mistral = tiny("llama"), mixtral_window = tiny("mixtral");
  mistral["sliding_window"] = int64_t{5}, mixtral_window["sliding_window"] = int64_t{6};
  const std::vector<std::tuple<std::string, std::string, std::map<std::string, Value>>> cases = {
      {"gpt", "gpt", tiny("gpt")}, {"llama", "llama", tiny("llama")}, {"mixtral", "mixtral", tiny("mixtral")}, {"llama_rope_llama3", "llama", llama3},
      {"qwen2", "llama", qwen2}, {"mistral", "llama", mistral}, {"mixtral_window", "mixtral", mixtral_window}};
  for (const auto& [case_name, name, settings] : cases) {
    at::manual_seed(5);
    auto model = make(name, settings);
    model->eval();
    {  // biases drawn, not zero, so that a bias in the wrong place shows in the logits
      at::NoGradGuard no_grad;
      for (auto& p : model->named_parameters())
        if (p.key().ends_with(".bias")) p.value().normal_();
    }
    Config config = config_for(factory(name), settings);
    const auto out = std::filesystem::path(dir) / case_name;
    std::filesystem::create_directories(out);
    write_safetensors(out / "model.safetensors", factory(name).to_hf(*model, config), {{"format", "pt"}});
    std::ofstream(out / "config.json") << factory(name).hf_config_json(config);
    at::Tensor tokens = at::randint(64, {2, 16}, at::kLong);
    at::NoGradGuard no_grad;
    write_safetensors(out / "expected.safetensors", {{"tokens", tokens}, {"logits", model->forward(tokens)}});
  }
}

// A windowed Llama exports as MistralForCausalLM and a windowed Mixtral as MixtralForCausalLM, the
// window in config.json (transformers_parity: the same logits); GPT-2 has no window and Qwen2's
// covers some layers only, so those refuse, naming the architecture.
TEST(Interchange, SlidingWindowExportsAsMistralOrMixtral) {
  auto config_json = [](const std::string& name, std::map<std::string, Value> settings) {
    settings["sliding_window"] = int64_t{5};
    return factory(name).hf_config_json(config_for(factory(name), settings));
  };
  const std::string mistral = config_json("llama", tiny("llama")), mixtral = config_json("mixtral", tiny("mixtral"));
  EXPECT_NE(mistral.find("\"architectures\": [\"MistralForCausalLM\"]"), std::string::npos) << mistral;
  EXPECT_NE(mistral.find("\"model_type\": \"mistral\""), std::string::npos) << mistral;
  EXPECT_NE(mistral.find("\"sliding_window\": 5,"), std::string::npos) << mistral;
  EXPECT_NE(mixtral.find("\"sliding_window\": 5,"), std::string::npos) << mixtral;
  EXPECT_EQ(factory("llama").hf_config_json(config_for(factory("llama"), tiny("llama"))).find("sliding_window"), std::string::npos);
  std::map<std::string, Value> qwen2 = tiny("llama");
  qwen2["qkv_bias"] = true;
  for (const auto& [name, settings, refusal] : std::vector<std::tuple<std::string, std::map<std::string, Value>, std::string>>{
           {"gpt", tiny("gpt"), "GPT2LMHeadModel has no sliding window"}, {"llama", qwen2, "Qwen2ForCausalLM has no sliding window"}}) {
    try {
      config_json(name, settings);
      ADD_FAILURE() << name << " exported with a window";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(refusal), std::string::npos) << e.what();
    }
  }
}

// Deferred, sharded construction: a model built as tensor rank i of n holds exactly the pieces
// of the whole model (same seed) that its placements name, at 1, 2, 3 and 4 parts, for GPT (fused
// q/k/v split per head, vocabulary rows) and Llama with kv heads split (kv 4 at 2 and 4 parts)
// and whole (kv 4 at 3 parts).
void check_shards(const std::string& name, std::map<std::string, Value> values) {
  const ModelFactory& f = factory(name);
  const Config config = config_for(f, values);
  at::manual_seed(11);
  auto whole = f.create(config);
  auto whole_params = whole->named_parameters();
  for (int64_t parts : {1, 2, 3, 4}) {
    for (int64_t index = 0; index < parts; ++index) {
      at::manual_seed(11);
      auto piece = f.create_shard(config, {parts, index});
      const Placements placements = nn::parameter_placements(*piece);
      for (const auto& p : piece->named_parameters()) {
        const auto placement = placements.find(p.key());
        const at::Tensor expected =
            placement == placements.end() ? whole_params[p.key()] : testing::piece_of(whole_params[p.key()], placement->second);
        EXPECT_TRUE(at::equal(p.value(), expected)) << name << " " << p.key() << " part " << index << "/" << parts;
      }
    }
  }
}

TEST(ModelShards, GptPiecesAreTheWholeModelsPiecesAtAnyTensorSize) {
  check_shards("gpt", {{"n_layer", int64_t{2}}, {"n_head", int64_t{12}}, {"d_model", int64_t{48}}, {"vocab_size", int64_t{96}},
                       {"seq_len", int64_t{16}}});
}

TEST(ModelShards, LlamaPiecesWithKvHeadsSplitAndWhole) {
  check_shards("llama", {{"n_layer", int64_t{2}}, {"n_head", int64_t{12}}, {"n_kv_head", int64_t{4}}, {"d_model", int64_t{48}},
                         {"ffn_hidden", int64_t{96}}, {"vocab_size", int64_t{96}}, {"seq_len", int64_t{16}}});
}

// [model] init_from into a split model: every rank keeps exactly its piece of the whole Hugging
// Face weights, for GPT (fused c_attn split per head, 66 vocabulary rows: uneven over 4 parts) and
// Llama with kv heads split (2 parts) and whole (4 parts, 2 kv heads). A tensor of the wrong shape
// is refused by name.
void check_init_from_shards(const std::string& name, std::map<std::string, Value> values) {
  const ModelFactory& f = factory(name);
  at::manual_seed(21);
  auto source = f.create(config_for(f, values));
  auto source_params = source->named_parameters();
  const auto dir = std::filesystem::temp_directory_path() / ("strata_init_from_shards_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  NamedTensors hf = f.to_hf(*source, config_for(f, values));
  write_safetensors(dir / "model.safetensors", hf, {{"format", "pt"}});
  values["init_from"] = dir.string();
  const Config config = config_for(f, values);
  for (int64_t parts : {2, 4}) {
    for (int64_t index = 0; index < parts; ++index) {
      auto piece = f.create_shard(config, {parts, index});  // the generator moved on: the random init differs
      const Placements placements = nn::parameter_placements(*piece);
      EXPECT_FALSE(placements.empty());
      for (const auto& p : piece->named_parameters()) {
        const auto placement = placements.find(p.key());
        const at::Tensor expected =
            placement == placements.end() ? source_params[p.key()] : testing::piece_of(source_params[p.key()], placement->second);
        EXPECT_TRUE(at::equal(p.value(), expected)) << name << " " << p.key() << " part " << index << "/" << parts;
      }
    }
  }
  // The first tensor (a split embedding in both models) with one row too many.
  hf.front().second = at::cat({hf.front().second, hf.front().second.narrow(0, 0, 1)});
  write_safetensors(dir / "model.safetensors", hf, {{"format", "pt"}});
  try {
    f.create_shard(config, {2, 1});
    ADD_FAILURE() << "a mis-shaped tensor was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [" + std::to_string(std::get<int64_t>(values["vocab_size"]) + 1)), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ModelShards, InitFromGivesEachRankItsPieceOfTheWholeWeights) {
  check_init_from_shards("gpt", {{"n_layer", int64_t{2}}, {"n_head", int64_t{4}}, {"d_model", int64_t{32}}, {"vocab_size", int64_t{66}},
                                 {"seq_len", int64_t{16}}});
  check_init_from_shards("llama", {{"n_layer", int64_t{2}}, {"n_head", int64_t{8}}, {"n_kv_head", int64_t{2}}, {"d_model", int64_t{32}},
                                   {"ffn_hidden", int64_t{64}}, {"vocab_size", int64_t{64}}, {"seq_len", int64_t{16}}});
}

TEST(ModelShards, IndivisibleSizesAreRefusedNamingTheKey) {
  const Config config = config_for(factory("gpt"), tiny("gpt"));  // 4 heads
  EXPECT_THROW(factory("gpt").create_shard(config, {3, 0}), UserError);
  EXPECT_EQ(factory("gpt").split_problem(config, 3), "[model] n_head 4 does not divide by [parallel] tensor = 3");
  EXPECT_EQ(factory("gpt").split_problem(config, 2), "");
}

// A vocabulary that does not divide splits unevenly (no padding rows): pieces differ by one row,
// cover the vocabulary once, and hold the whole model's values.
TEST(ModelShards, UnevenVocabularySplitsWithoutPadding) {
  int64_t covered = 0;
  for (int64_t index = 0; index < 4; ++index) {
    const nn::ShardRange r = nn::shard_range(385, {4, index});
    EXPECT_EQ(r.start, covered);
    EXPECT_EQ(r.size, index == 0 ? 97 : 96);
    covered += r.size;
  }
  EXPECT_EQ(covered, 385);
  check_shards("gpt", {{"n_layer", int64_t{1}}, {"n_head", int64_t{12}}, {"d_model", int64_t{48}}, {"vocab_size", int64_t{99}},
                       {"seq_len", int64_t{8}}});
  check_shards("llama", {{"n_layer", int64_t{1}}, {"n_head", int64_t{12}}, {"n_kv_head", int64_t{4}}, {"d_model", int64_t{48}},
                         {"ffn_hidden", int64_t{96}}, {"vocab_size", int64_t{99}}, {"seq_len", int64_t{8}},
                         {"tie_embeddings", false}});
}

// Sequence-parallel dropout: each rank's mask is its tokens' rows of the mask at::dropout draws
// for the whole sequence from the same generator state, bit for bit, and every rank leaves the
// generator where at::dropout does.
TEST(Dropout, SequenceShardsApplyRowsOfTheWholeSequencesMask) {
  const at::Tensor x = at::randn({2, 12, 5});
  at::manual_seed(11);
  const at::Tensor whole = at::dropout(x, 0.25, /*train=*/true);
  const double after = at::rand({1}).item<double>();
  for (int64_t parts : {1, 2, 3, 4})
    for (int64_t index = 0; index < parts; ++index) {
      nn::Dropout dropout(0.25);
      dropout.sequence_shard = {parts, index};
      const int64_t local = 12 / parts;
      at::manual_seed(11);
      EXPECT_TRUE(at::equal(dropout.forward(x.narrow(1, index * local, local)), whole.narrow(1, index * local, local)))
          << index << "/" << parts;
      EXPECT_EQ(at::rand({1}).item<double>(), after);
    }
  nn::Dropout dropout(0.25);
  dropout.sequence_shard = {2, 1};
  dropout.eval();
  EXPECT_TRUE(at::equal(dropout.forward(x), x));
}

// A tiny GPT with dropout 0.2 in training mode and a batch of tokens for it: what the
// micro-batch randomness tests draw masks from.
std::pair<std::shared_ptr<nn::Model>, at::Tensor> training_gpt_with_dropout() {
  auto values = tiny("gpt");
  values["dropout"] = 0.2;
  auto model = make("gpt", values);
  model->train();
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(model->vocab_size(), {2, model->seq_len()}, at::kLong);
  return {model, tokens};
}

// Dropout keyed by micro-batch: inside a scope each block draws from generators seeded by (seed,
// step, micro-batch, data rank, block name), whatever ran before and whichever blocks a call runs
// (a pipeline stage runs some), and the job's generator does not move.
TEST(MicroBatchRandomness, BlocksDrawByKeyNotByOrder) {
  const auto built = training_gpt_with_dropout();
  const std::shared_ptr<nn::Model>& model = built.first;
  const at::Tensor& tokens = built.second;
  at::NoGradGuard no_grad;
  auto run = [&](int64_t step, int64_t micro, int64_t data_rank, bool split) {
    const nn::MicroBatchRandomness randomness(1234, step, micro, data_rank);
    if (!split) return model->forward(tokens);
    const size_t n = model->num_blocks();
    at::Tensor mid = model->forward_blocks(0, 2, tokens);
    at::rand({7});  // draws between stages do not matter
    return model->forward_blocks(2, n, mid);
  };
  const at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  const at::Tensor a = run(3, 1, 0, false);
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), state));
  at::rand({3});
  EXPECT_TRUE(at::equal(run(3, 1, 0, true), a));
  EXPECT_FALSE(at::equal(run(3, 2, 0, false), a));
  EXPECT_FALSE(at::equal(run(4, 1, 0, false), a));
  EXPECT_FALSE(at::equal(run(3, 1, 1, false), a));
  // Without a scope the generator's stream is drawn from and moves on.
  const at::Tensor before = at::detail::getDefaultCPUGenerator().get_state();
  model->forward(tokens);
  EXPECT_FALSE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), before));
}

// Inside an UnkeyedRandomness (ABI 1.3: the cuda_graph pass's capture, where a generator may not be
// reseeded) a micro-batch scope seeds nothing: blocks draw from the generator as it stands, as
// without a scope, and the scope keys the draws again once it is gone.
TEST(MicroBatchRandomness, UnkeyedScopeDrawsAsWithoutAScope) {
  const auto built = training_gpt_with_dropout();
  const std::shared_ptr<nn::Model>& model = built.first;
  const at::Tensor& tokens = built.second;
  at::NoGradGuard no_grad;
  at::manual_seed(9);
  const at::Tensor no_scope = model->forward(tokens);
  const nn::MicroBatchRandomness randomness(1234, 3, 1, 0);
  const at::Tensor keyed = model->forward(tokens);
  at::manual_seed(9);
  at::Tensor unkeyed;
  {
    const nn::UnkeyedRandomness off;
    const nn::UnkeyedRandomness nested;  // scopes nest
    unkeyed = model->forward(tokens);
  }
  EXPECT_TRUE(at::equal(unkeyed, no_scope));
  EXPECT_FALSE(at::equal(unkeyed, keyed));
  at::manual_seed(9);
  EXPECT_TRUE(at::equal(model->forward(tokens), keyed));
}

TEST(LayerHooks, InterceptInputAndOutputAndRowBiasAfterTheSum) {
  at::manual_seed(2);
  nn::Linear whole(4, 3, true);
  at::NoGradGuard no_grad;
  whole.bias.normal_();
  const at::Tensor x = at::randn({2, 4});
  // Two row pieces whose partial products a hook "sums" (here: doubles, as two equal ranks would).
  nn::Linear row(4, 3, true, nn::ParallelStyle::Row, {2, 0});
  row.weight.copy_(whole.weight.narrow(1, 0, 2));
  row.bias.copy_(whole.bias);
  row.hooks.on_input = [](const at::Tensor& t) { return t.narrow(1, 0, 2); };
  row.hooks.on_output = [](const at::Tensor& t) { return t * 2; };
  // The bias is added once, after on_output.
  EXPECT_TRUE(at::allclose(row.forward(x), at::matmul(x.narrow(1, 0, 2), whole.weight.narrow(1, 0, 2).t()) * 2 + whole.bias));
  whole.hooks.on_output = [](const at::Tensor& t) { return t + 1; };
  EXPECT_TRUE(at::allclose(whole.forward(x), at::linear(x, whole.weight, whole.bias) + 1));
}

}  // namespace
}  // namespace strata
