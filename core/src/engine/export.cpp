// strata ckpt export: a checkpoint's model weights as a Hugging Face checkpoint.
#include <fstream>

#include "checkpoint.h"
#include "strata/core/log.h"
#include "strata/core/trainer.h"
#include "strata/errors.h"
#include "strata/interchange.h"
#include "strata/model.h"
#include "strata/safetensors.h"

namespace strata {

namespace fs = std::filesystem;

fs::path export_hf(const fs::path& source, const fs::path& out, const ComponentRegistry& registry) {
  // A checkpoint directory sits in RUN/checkpoints/; the run directory holds strategy.toml.
  const bool is_checkpoint = fs::exists(source / "manifest.json");
  const fs::path run_dir = is_checkpoint ? source.parent_path().parent_path() : source;
  Diagnostics diagnostics;
  RawStrategy raw = load_strategy_file(run_dir / "strategy.toml", diagnostics);
  ResolvedStrategy plan = resolve_strategy(raw, registry, 1, diagnostics);
  if (!diagnostics.ok()) throw UserError("cannot read the run's strategy: " + diagnostics.items().front().pos.str() + ": " +
                                         diagnostics.items().front().message);

  std::optional<engine::Checkpoint> checkpoint;
  if (is_checkpoint) {
    checkpoint = engine::Checkpoint::open(source);
  } else {
    checkpoint = engine::open_newest_valid_checkpoint(run_dir / "checkpoints", [](const std::string& m) { log::warn(m); });
    if (!checkpoint) throw UserError("no valid checkpoint in " + (run_dir / "checkpoints").string());
  }

  const auto* factory = static_cast<const ModelFactory*>(plan.model_component);
  Config config = plan.model;
  if (config.has("init_from")) config.set("init_from", Config::Entry{std::string(), Origin::Default, {}});
  auto model = factory->create(config);
  std::vector<engine::TensorRequest> requests;
  for (const auto& p : model->named_parameters())
    requests.push_back({"model/" + p.key(), at::empty_like(p.value(), at::MemoryFormat::Contiguous), std::nullopt});
  checkpoint->fill(requests, 0);
  NamedTensors weights;
  for (auto& q : requests) weights.emplace_back(q.name.substr(6), q.target);
  load_parameters(*model, weights, "checkpoint " + checkpoint->path().string());

  fs::create_directories(out);
  write_safetensors(out / "model.safetensors", factory->to_hf(*model, config), {{"format", "pt"}});
  std::ofstream(out / "config.json") << factory->hf_config_json(config);
  return checkpoint->path();
}

}  // namespace strata
