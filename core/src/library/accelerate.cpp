// The library API (strata/accelerate.h): the program's components are registered as one more
// plugin, the strategy is planned by the checks `strata plan` runs, and the Trainer `strata run`
// runs is built from the plan. Nothing here trains: the trainer's step program does.
#include "strata/accelerate.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include <ATen/ATen.h>

#include "accelerate_automatic.h"
#include "strata/core/launch_env.h"
#include "strata/core/plugin_loader.h"
#include "strata/core/step_plan.h"
#include "strata/core/tune.h"
#include "strata/errors.h"
#include "strata/nn.h"

namespace strata {

Strategy Strategy::from_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw UserError("cannot read strategy file " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return from_toml(text.str(), file.string());
}

Strategy Strategy::from_toml(std::string text, std::string label) {
  Strategy strategy;
  strategy.text_ = std::move(text);
  strategy.label_ = std::move(label);
  return strategy;
}

Strategy Strategy::automatic(int64_t ranks, std::string base, double memory_gb, int trials) {
  Strategy strategy = from_toml(std::move(base), "<automatic strategy>");
  strategy.automatic_ranks_ = ranks;
  strategy.memory_gb_ = memory_gb;
  strategy.trials_ = trials;
  return strategy;
}

Strategy& Strategy::set(std::string key_value) {
  sets_.push_back(std::move(key_value));
  return *this;
}

Strategy& Strategy::disable(std::string pass) {
  disables_.push_back(std::move(pass));
  return *this;
}

namespace {

// A part of a plain module that becomes one block: the whole module (type "block", as passes
// select by default), or one child of a Sequential. The block is the unit fsdp gathers and
// act_checkpoint recomputes.
struct PlainPart {
  std::string name, type;
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
};

class PlainModuleBlock final : public nn::Block {
 public:
  explicit PlainModuleBlock(PlainPart part) : Block(std::move(part.type)), forward_(std::move(part.forward)) {
    register_module("net", std::move(part.module));
  }
  at::Tensor forward(const at::Tensor& x) override { return forward_(x); }

 private:
  std::function<at::Tensor(const at::Tensor&)> forward_;
};

class PlainModuleFactory final : public ModelFactory {
 public:
  PlainModuleFactory(std::string name, std::function<std::vector<PlainPart>()> build, int64_t vocab_size, int64_t seq_len)
      : ModelFactory({ComponentKind::Model, std::move(name), "a program's plain torch::nn::Module", Schema()}),
        build_(std::move(build)),
        vocab_size_(vocab_size),
        seq_len_(seq_len) {}
  std::shared_ptr<nn::Model> create(const Config&) const override {
    std::vector<PlainPart> parts = build_();
    if (parts.empty()) throw UserError("model '" + name() + "': the plain module's build function returned no module");
    auto model = std::make_shared<nn::Model>(vocab_size_, seq_len_);
    for (auto& part : parts) {
      if (!part.module || !part.forward) throw UserError("model '" + name() + "': the plain module's build function returned no module");
      const std::string block = part.name;
      model->add_block(block, std::make_shared<PlainModuleBlock>(std::move(part)));
    }
    return model;
  }
  std::string split_problem(const Config&, int64_t parts) const override { return parts > 1 ? model_parallel_refusal("tensor") : ""; }
  std::string model_parallel_refusal(const std::string& dim) const {
    return "model '" + name() + "' is a plain torch::nn::Module, which [parallel] " + dim +
           " cannot split: write it as blocks of strata::nn layers (an nn::Model; docs/library.md) to use model parallelism";
  }

 private:
  std::function<std::vector<PlainPart>()> build_;
  int64_t vocab_size_, seq_len_;
};

class TensorTokens final : public TokenDataset {
 public:
  TensorTokens(int64_t vocab_size, at::Tensor train, at::Tensor validation)
      : vocab_size_(vocab_size), train_(std::move(train)), validation_(std::move(validation)) {}
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t num_tokens(Split split) const override { return tokens(split).numel(); }
  void read(Split split, int64_t begin, int64_t count, int64_t* out) const override {
    std::copy_n(tokens(split).data_ptr<int64_t>() + begin, count, out);
  }

 private:
  const at::Tensor& tokens(Split split) const { return split == Split::Train ? train_ : validation_; }
  int64_t vocab_size_;
  at::Tensor train_, validation_;
};

class TensorDatasetFactory final : public DatasetFactory {
 public:
  TensorDatasetFactory(std::string name, int64_t vocab_size, at::Tensor train, at::Tensor validation)
      : DatasetFactory({ComponentKind::Dataset, std::move(name), "token streams held by the program", Schema()}),
        vocab_size_(vocab_size),
        train_(as_stream(train, "train")),
        validation_(as_stream(validation, "validation")) {}
  std::unique_ptr<TokenDataset> open(const Config&, const DataContext&) const override {
    return std::make_unique<TensorTokens>(vocab_size_, train_, validation_);
  }

 private:
  // 1-D int64 on the CPU, contiguous, every token below the vocabulary size.
  at::Tensor as_stream(const at::Tensor& tokens, const std::string& split) const {
    const std::string what = "dataset '" + name() + "': the " + split + " tokens ";
    if (!tokens.defined() || tokens.dim() != 1 || at::isFloatingType(tokens.scalar_type()) || tokens.numel() < 2)
      throw UserError(what + "must be a 1-D integer tensor of at least 2 tokens");
    at::Tensor stream = tokens.to(at::kCPU, at::kLong).contiguous();
    if (stream.min().item<int64_t>() < 0 || stream.max().item<int64_t>() >= vocab_size_)
      throw UserError(what + "must lie in [0, " + std::to_string(vocab_size_) + ")");
    return stream;
  }
  int64_t vocab_size_;
  at::Tensor train_, validation_;
};

// The program's component fills `dotted` ("job.model"); a strategy naming another is refused.
void name_component(const RawSection& section, const std::string& dotted, const std::string& name, StringList& sets) {
  const std::string key = dotted.substr(dotted.find('.') + 1);
  const RawEntry* entry = section.find(key);
  if (entry && std::holds_alternative<std::string>(entry->value) && std::get<std::string>(entry->value) != name)
    throw UserError("the strategy's " + section.label + " " + key + " = \"" + std::get<std::string>(entry->value) +
                    "\" but accelerate() was given \"" + name + "\"; leave the key out or name that one");
  sets.push_back(dotted + "=" + name);
}

}  // namespace

std::unique_ptr<ModelFactory> plain_module_factory(std::string name, std::function<PlainModule()> build, int64_t vocab_size,
                                                   int64_t seq_len) {
  auto parts = [build = std::move(build)] {
    PlainModule plain = build();
    return std::vector<PlainPart>{{"module", "block", std::move(plain.module), std::move(plain.forward)}};
  };
  return std::make_unique<PlainModuleFactory>(std::move(name), std::move(parts), vocab_size, seq_len);
}

std::unique_ptr<ModelFactory> plain_sequential(std::string name, std::function<torch::nn::Sequential()> build, int64_t vocab_size,
                                               int64_t seq_len) {
  auto parts = [build = std::move(build), name] {
    torch::nn::Sequential sequential = build();
    if (!sequential || sequential->size() == 0) throw UserError("model '" + name + "': the Sequential has no children");
    std::vector<PlainPart> out;
    const auto children = sequential->named_children();
    size_t i = 0;
    for (const torch::nn::AnyModule& held : *sequential) {
      const std::string type = i == 0 ? "embedding" : i + 1 == sequential->size() ? "head" : "block";
      // A copy of an AnyModule refers to the same module: the block calls the child's forward.
      auto child = std::make_shared<torch::nn::AnyModule>(held);
      out.push_back({children[i].key(), type, sequential->ptr(i), [child](const at::Tensor& x) { return child->forward<at::Tensor>(x); }});
      ++i;
    }
    return out;
  };
  return std::make_unique<PlainModuleFactory>(std::move(name), std::move(parts), vocab_size, seq_len);
}

std::unique_ptr<DatasetFactory> tensor_dataset(std::string name, int64_t vocab_size, at::Tensor train, at::Tensor validation) {
  return std::make_unique<TensorDatasetFactory>(std::move(name), vocab_size, std::move(train), std::move(validation));
}

Accelerated accelerate(std::unique_ptr<ModelFactory> model, OptimizerSpec optimizer, std::unique_ptr<DatasetFactory> dataset,
                       LossFn loss, Strategy strategy, AccelerateOptions options) {
  Accelerated out;
  try {
    const LaunchEnv env = detect_launch_env();
    out.registry = std::make_unique<ComponentRegistry>();
    std::vector<std::filesystem::path> search{installed_plugin_dir()};
    search.insert(search.end(), options.plugin_dirs.begin(), options.plugin_dirs.end());
    PluginLoader(*out.registry).load_search_path(search);

    Diagnostics diagnostics;
    RawStrategy raw = parse_strategy_text(strategy.text(), strategy.label(), diagnostics);
    if (!diagnostics.ok()) throw UserError(diagnostics.str());
    apply_overrides(raw, strategy.sets(), strategy.disables(), diagnostics);
    if (!diagnostics.ok()) throw UserError(diagnostics.str());
    // The program's components, registered as a plugin of their own, named in the strategy.
    StringList sets;
    std::vector<std::unique_ptr<Component>> own;
    if (model) name_component(raw.job, "job.model", model->name(), sets), own.push_back(std::move(model));
    if (dataset) name_component(raw.job, "job.dataset", dataset->name(), sets), own.push_back(std::move(dataset));
    if (optimizer.custom)
      name_component(raw.optimizer, "optimizer.name", optimizer.custom->name(), sets), own.push_back(std::move(optimizer.custom));
    else if (!optimizer.name.empty())
      name_component(raw.optimizer, "optimizer.name", optimizer.name, sets);
    for (const auto& setting : optimizer.settings) sets.push_back("optimizer." + setting);
    if (!own.empty()) out.registry->register_components({"program", "", "<this program>", "", {}}, std::move(own));
    apply_overrides(raw, sets, {}, diagnostics);
    if (!diagnostics.ok()) throw UserError(diagnostics.str());
    if (strategy.automatic_ranks() > 0) raw = automatic_strategy(raw, *out.registry, strategy, env.world_size, options.run, out.status);

    CheckedPlan checked;
    if (!check_plan(raw, *out.registry, env.world_size, checked, diagnostics)) throw UserError(diagnostics.str());
    if (env.rank == 0)  // keys nothing will read, as `strata run` notes them
      for (const std::string& note : checked.unread_notes) std::cerr << "strata: note: " << note << "\n";
    if (const auto* plain = dynamic_cast<const PlainModuleFactory*>(checked.plan.model_component)) {
      const ParallelLayout& l = checked.plan.layout;
      for (const auto& [dim, size] : {std::pair<const char*, int64_t>{"tensor", l.mesh.tensor}, {"pipeline", l.mesh.pipeline}, {"context", l.mesh.context},
                                      {"expert", l.mesh.expert}})
        if (size > 1) throw UserError(plain->model_parallel_refusal(std::string(dim) + " = " + std::to_string(size)));
    }
    out.strategy = resolved_strategy_toml(checked.plan);
    RunOptions run = options.run;
    run.loss = std::move(loss);
    out.trainer = std::make_unique<Trainer>(checked.plan, checked.order, *out.registry, std::move(run));
    out.step_program = describe_step_program(out.trainer->job().program);
    out.ok = true;
  } catch (const UserError& e) {
    out.ok = false;
    out.status = e.what();
    out.trainer.reset();
  }
  return out;
}

}  // namespace strata
