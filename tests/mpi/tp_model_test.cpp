// The model IR is ready for tensor parallel: GPT and Llama built as tensor rank r of the world
// (local shapes, create_shard: heads, MLP width and vocabulary split), with the conjugate
// collectives attached at the layers' interception points and the vocab-parallel loss, give the
// whole model's logits, loss and gradients. Runs at 2 and 4 ranks; Llama
// with 4 kv heads splits them at 2 and 4 ranks (and keeps them whole where they do not divide).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "../../core/src/checkpoint/checkpoint.h"
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

// The tensor_parallel pass's rules (plugins/tensor_parallel): column layers and the tied head take
// their input through copy_to_group; row layers' partial outputs and the vocab-parallel
// embedding's go through reduce_from_group; whole layers in the region (Llama's unsplit kv,
// Replicated) send their output gradient through copy_to_group.
void attach_tensor_parallel(nn::Model& model, Communicator& group) {
  auto copy = [&group](const at::Tensor& x) { return dist::copy_to_group(x, group); };
  auto reduce = [&group](const at::Tensor& y) { return dist::reduce_from_group(y, group); };
  for (const auto& m : model.named_modules()) {
    if (auto* linear = dynamic_cast<nn::Linear*>(m.value().get())) {
      if (linear->parallel_style == nn::ParallelStyle::Row) linear->hooks.on_output = reduce;
      if (linear->parallel_style == nn::ParallelStyle::Column) linear->hooks.on_input = copy;
      if (linear->parallel_style == nn::ParallelStyle::Replicated) linear->hooks.on_output = copy;
    } else if (auto* embedding = dynamic_cast<nn::Embedding*>(m.value().get()); embedding && embedding->shard.parts > 1) {
      embedding->hooks.on_output = reduce;
    } else if (auto* head = dynamic_cast<nn::TiedLinear*>(m.value().get())) {
      head->hooks.on_input = copy;
    }
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
  const at::Tensor whole_logits = whole->forward(x);
  at::Tensor whole_loss = at::cross_entropy_loss(whole_logits.reshape({-1, whole->vocab_size()}), y.reshape(-1));
  whole_loss.backward();
  // The piece's logits are this rank's vocabulary columns; its loss never gathers them.
  const at::Tensor piece_logits = piece->forward(x);
  const int64_t local = piece_logits.size(-1);
  at::Tensor piece_loss = dist::vocab_parallel_cross_entropy(piece_logits.reshape({-1, local}), y.reshape(-1), group.rank() * local, group);
  piece_loss.backward();
  EXPECT_TRUE(at::allclose(piece_logits.detach(), whole_logits.detach().narrow(-1, group.rank() * local, local), 1e-4, 1e-5)) << name;
  EXPECT_NEAR(piece_loss.item<double>(), whole_loss.item<double>(), 1e-5) << name;

  // Every gradient equals its piece of the whole model's: split ones by their placements, whole
  // ones (norms, positions, row biases, replicated kv) entirely.
  const Placements placements = nn::parameter_placements(*piece);
  auto whole_params = whole->named_parameters();
  for (const auto& p : piece->named_parameters()) {
    at::Tensor expected = whole_params[p.key()].grad();
    if (auto placement = placements.find(p.key()); placement != placements.end()) expected = testing::piece_of(expected, placement->second);
    EXPECT_TRUE(at::allclose(p.value().grad(), expected, 1e-4, 1e-6)) << name << " " << p.key();
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
  world->barrier()->wait();  // every rank has read it
  if (rank == 0) std::filesystem::remove_all(dir);
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
