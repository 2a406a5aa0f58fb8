// The model IR is ready for tensor parallel: GPT and Llama built as tensor rank r of the world
// (local shapes, create_shard), with the conjugate collectives attached at the layers'
// interception points (column layers' inputs through copy_to_group, row layers' outputs through
// reduce_from_group), give the whole model's logits and gradients. Runs at 2 and 4 ranks; Llama
// with 4 kv heads splits them at 2 and 4 ranks (and keeps them whole where they do not divide).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "../../core/src/engine/checkpoint.h"
#include "mpi_world.h"
#include "strata/dist.h"
#include "strata/model.h"
#include "strata/testing.h"

namespace strata {
namespace {

const ModelFactory& factory(const std::string& name) {
  static ComponentRegistry* registry = [] {
    auto* r = new ComponentRegistry();
    PluginLoader(*r).load_search_path({installed_plugin_dir()});
    return r;
  }();
  return *dynamic_cast<const ModelFactory*>(registry->find(ComponentKind::Model, name));
}

// Column layers (and layers kept whole inside the region, Llama's unsplit kv) take the input
// through copy_to_group; row layers' partial outputs go through reduce_from_group.
void attach_tensor_parallel(nn::Model& model, Communicator& group) {
  for (const auto& m : model.named_modules()) {
    auto* linear = dynamic_cast<nn::Linear*>(m.value().get());
    if (!linear || m.key().find("lm_head") != std::string::npos) continue;
    if (linear->parallel_style == nn::ParallelStyle::Row)
      linear->hooks.on_output = [&group](const at::Tensor& y) { return dist::reduce_from_group(y, group); };
    else
      linear->hooks.on_input = [&group](const at::Tensor& x) { return dist::copy_to_group(x, group); };
  }
}

void check_model(const std::string& name, const std::map<std::string, Value>& values) {
  Communicator& group = *testing::mpi_world();
  const Config config = testing::config_for(factory(name), values);
  at::manual_seed(5);
  auto whole = factory(name).create(config);
  at::manual_seed(5);
  auto piece = factory(name).create_shard(config, {group.size(), group.rank()});
  attach_tensor_parallel(*piece, group);
  at::manual_seed(6);
  const at::Tensor tokens = at::randint(whole->vocab_size(), {2, whole->seq_len() + 1}, at::kLong);
  const at::Tensor x = tokens.narrow(1, 0, whole->seq_len()), y = tokens.narrow(1, 1, whole->seq_len());
  auto loss_of = [&](nn::Model& m) {
    const at::Tensor logits = m.forward(x);
    at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, m.vocab_size()}), y.reshape(-1));
    loss.backward();
    return std::pair(logits.detach(), loss.item<double>());
  };
  const auto [whole_logits, whole_loss] = loss_of(*whole);
  const auto [piece_logits, piece_loss] = loss_of(*piece);
  EXPECT_TRUE(at::allclose(piece_logits, whole_logits, 1e-4, 1e-5)) << name;
  EXPECT_NEAR(piece_loss, whole_loss, 1e-5) << name;

  std::map<std::string, std::shared_ptr<torch::nn::Module>> whole_modules;
  for (const auto& m : whole->named_modules()) whole_modules[m.key()] = m.value();
  for (const auto& m : piece->named_modules()) {
    const auto* linear = dynamic_cast<const nn::Linear*>(m.value().get());
    for (const auto& p : m.value()->named_parameters(false)) {
      at::Tensor grad = p.value().grad();
      at::Tensor expected = whole_modules.at(m.key())->named_parameters(false)[p.key()].grad();
      const bool split = linear && linear->shard.parts > 1;
      const bool inside_region = linear && m.key().find("lm_head") == std::string::npos;
      if (split && (linear->parallel_style == nn::ParallelStyle::Column || p.key() == "weight")) {
        const int64_t dim = linear->parallel_style == nn::ParallelStyle::Row ? 1 : 0;
        const int64_t sections = dim == 0 ? linear->fused_sections : 1, section = expected.size(dim) / sections;
        const int64_t part = section / linear->shard.parts;
        std::vector<at::Tensor> pieces;
        for (int64_t s = 0; s < sections; ++s) pieces.push_back(expected.narrow(dim, s * section + linear->shard.index * part, part));
        expected = at::cat(pieces, dim);
      } else if (inside_region && !split) {
        // Whole weights inside the region (unsplit kv) get partial gradients: sum them.
        grad = grad.clone();
        group.all_reduce(grad, ReduceOp::Sum)->wait();
      }
      EXPECT_TRUE(at::allclose(grad, expected, 1e-4, 1e-6)) << name << " " << m.key() << "." << p.key();
    }
  }
}

TEST(TensorParallelModels, GptMatchesTheWholeModel) {
  check_model("gpt", {{"n_layer", int64_t{2}}, {"n_head", int64_t{4}}, {"d_model", int64_t{32}}, {"vocab_size", int64_t{64}},
                      {"seq_len", int64_t{16}}});
}

TEST(TensorParallelModels, LlamaMatchesTheWholeModel) {
  check_model("llama", {{"n_layer", int64_t{2}}, {"n_head", int64_t{8}}, {"n_kv_head", int64_t{4}}, {"d_model", int64_t{32}},
                        {"ffn_hidden", int64_t{64}}, {"vocab_size", int64_t{64}}, {"seq_len", int64_t{16}}});
}

TEST(TensorParallelModels, LlamaWithWholeKvHeadsMatchesTheWholeModel) {
  // 2 kv heads over 4 ranks do not divide: k and v stay whole, each rank picks its q heads' kv.
  if (testing::mpi_world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_model("llama", {{"n_layer", int64_t{2}}, {"n_head", int64_t{8}}, {"n_kv_head", int64_t{2}}, {"d_model", int64_t{32}},
                        {"ffn_hidden", int64_t{64}}, {"vocab_size", int64_t{64}}, {"seq_len", int64_t{16}}});
}

// A model saved as tensor shards (the placements parameter_placements gives, as the trainer's
// model state records them) loads bit-exactly at tensor sizes 1, 2 and 4: GPT's fused c_attn
// split per head (sections), Llama's q/k/v/o and gate/up/down.
void check_resharding(const std::string& name, const std::map<std::string, Value>& values) {
  auto world = testing::mpi_world();
  const int rank = world->rank(), size = world->size();
  const Config config = testing::config_for(factory(name), values);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("strata_tp_reshard_" + name);
  if (rank == 0) std::filesystem::remove_all(dir);
  world->barrier()->wait();

  at::manual_seed(5);
  auto saved = factory(name).create_shard(config, {size, rank});
  NamedTensors tensors;
  for (const auto& p : saved->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  engine::save_checkpoint(dir, {1, "hash", size}, tensors, nn::parameter_placements(*saved), 1, *world, at::kCPU);
  const engine::Checkpoint checkpoint = engine::Checkpoint::open(dir / "step_00000001");

  for (const int64_t parts : {1, 2, 4}) {
    at::manual_seed(5);
    auto expected = factory(name).create_shard(config, {parts, rank % parts});
    const Placements placements = nn::parameter_placements(*expected);
    std::vector<engine::TensorRequest> requests;
    for (const auto& p : expected->named_parameters()) {
      const auto placement = placements.find(p.key());
      requests.push_back({p.key(), at::zeros_like(p.value()),
                          placement == placements.end() ? std::nullopt : std::optional<Placement>(placement->second)});
    }
    checkpoint.fill(requests, rank);
    for (const auto& q : requests)
      EXPECT_TRUE(at::equal(q.target, expected->named_parameters()[q.name])) << name << " at tensor size " << parts << ": " << q.name;
  }
}

TEST(TensorParallelCheckpoints, GptShardsLoadAtTensorSizesOneTwoAndFour) {
  check_resharding("gpt", {{"n_layer", int64_t{1}}, {"n_head", int64_t{4}}, {"d_model", int64_t{32}}, {"vocab_size", int64_t{64}},
                           {"seq_len", int64_t{16}}});
}

TEST(TensorParallelCheckpoints, LlamaShardsLoadAtTensorSizesOneTwoAndFour) {
  check_resharding("llama", {{"n_layer", int64_t{1}}, {"n_head", int64_t{8}}, {"n_kv_head", int64_t{4}}, {"d_model", int64_t{32}},
                             {"ffn_hidden", int64_t{64}}, {"vocab_size", int64_t{64}}, {"seq_len", int64_t{16}}});
}

}  // namespace
}  // namespace strata
