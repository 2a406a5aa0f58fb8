// strata ops: the operator table, and which implementation serves which device and dtype.
#include <iostream>

#include <ATen/ATen.h>

#include "commands.h"
#include "common.h"
#include "strata/core/cpu_features.h"
#include "strata/core/operator_table.h"

namespace strata::cli {

int run_ops(const Args& args) {
  allow_only(args, {});
  if (!args.positional.empty()) throw UserError("'strata ops' takes no arguments");
  ComponentRegistry registry;
  load_plugins(registry);
  OperatorTable& table = OperatorTable::global();
  table.install(registry);
  const at::Tensor cpu_f32 = at::empty({0}), cpu_bf16 = at::empty({0}, at::kBFloat16);
  for (const auto& op : table.operators()) {
    std::cout << op << "  (cpu float32: " << table.select(op, cpu_f32).name()
              << ", cpu bfloat16: " << table.select(op, cpu_bf16).name() << ")\n";
    for (const auto* impl : table.implementations(op)) {
      const PluginRecord* plugin = registry.plugin_of(impl);
      const bool opt_in = !impl->defines_operator() && impl->priority() <= 0;  // served only where pinned
      std::cout << "  " << impl->name() << "  priority " << impl->priority() << (opt_in ? " (opt-in: pin it with module_replace)" : "")
                << ", " << impl->support().str()
                << ", from " << (plugin ? "plugin " + plugin->name : std::string("core")) << " - " << impl->info().summary << "\n";
    }
  }
  // The CPU paths the loaded kernels chose between (each decided once, at plugin load).
  const CpuFeatures& cpu = cpu_features();
  std::cout << "\nCPU paths on this machine (" << cpu.model << ": " << cpu_features_line() << ")\n";
  for (const CpuPathChoice& c : cpu_paths())
    std::cout << "  " << c.serves << ": " << c.chosen << " - " << c.why << "  [" << c.path << "]\n";
  std::cout << "STRATA_CPU_FALLBACK=KEY[,KEY...] or all forces the fallback of the paths named in brackets.\n";
  return 0;
}

}  // namespace strata::cli
