// strata plugins: what is loaded, from where, and what each plugin registers.
#include <iostream>

#include "commands.h"
#include "common.h"
#include "strata/abi.h"
#include "strata/pass.h"

namespace strata::cli {

namespace {

std::string pass_details(const Pass& pass) {
  const PassOrdering& o = pass.ordering();
  std::string out = std::string("phase ") + phase_name(o.phase);
  auto list = [&](const char* label, const StringList& names) {
    if (names.empty()) return;
    out += std::string(", ") + label + " ";
    for (size_t i = 0; i < names.size(); ++i) out += (i ? "/" : "") + names[i];
  };
  list("requires", o.requires_passes);
  list("conflicts", o.conflicts_with);
  list("after", o.after);
  list("before", o.before);
  return out;
}

toml::array names_array(const StringList& names) {
  toml::array array;
  for (const auto& n : names) array.push_back(n);
  return array;
}

}  // namespace

int run_plugins(const Args& args) {
  allow_only(args, {"--json"});
  if (!args.positional.empty()) throw UserError("'strata plugins' takes no arguments");
  ComponentRegistry registry;
  auto search_path = load_plugins(registry);

  if (args.json) {
    toml::array plugins;
    for (const auto& plugin : registry.plugins()) {
      toml::array components;
      for (const Component* c : plugin.components) {
        toml::table entry{{"kind", component_kind_name(c->kind())}, {"name", c->name()}, {"summary", c->info().summary}};
        if (const auto* pass = dynamic_cast<const Pass*>(c)) {
          const PassOrdering& o = pass->ordering();
          entry.insert("phase", phase_name(o.phase));
          entry.insert("requires", names_array(o.requires_passes));
          entry.insert("conflicts", names_array(o.conflicts_with));
          entry.insert("after", names_array(o.after));
          entry.insert("before", names_array(o.before));
        }
        if (const auto* loads = dynamic_cast<const LoadsHfModelTypes*>(c)) entry.insert("hf_model_types", names_array(loads->hf_model_types()));
        components.push_back(std::move(entry));
      }
      plugins.push_back(toml::table{{"name", plugin.name},
                                    {"version", plugin.version},
                                    {"path", plugin.path},
                                    {"torch_version", plugin.torch_version},
                                    {"abi", plugin.abi},
                                    {"components", std::move(components)}});
    }
    toml::array searched;
    for (const auto& p : search_path) searched.push_back(p.string());
    print_json(toml::table{{"abi_version", STRATA_ABI_VERSION_MAJOR}, {"abi_minor", STRATA_ABI_VERSION_MINOR}, {"search_path", std::move(searched)}, {"plugins", std::move(plugins)}});
    return 0;
  }

  std::cout << "Plugin search path:\n";
  for (const auto& p : search_path) std::cout << "  " << p.string() << "\n";
  std::cout << registry.plugins().size() << " plugins loaded (ABI " << STRATA_ABI_VERSION_MAJOR << "." << STRATA_ABI_VERSION_MINOR << ", libtorch "
            << STRATA_TORCH_VERSION_STRING << ")\n";
  for (const auto& plugin : registry.plugins()) {
    std::cout << "\n" << plugin.name << " " << plugin.version << "  " << plugin.path << (plugin.abi.empty() ? "" : "  (ABI " + plugin.abi + ")") << "\n";
    for (const Component* c : plugin.components) {
      std::cout << "  " << component_kind_name(c->kind()) << " " << c->name() << " - " << c->info().summary << "\n";
      if (const auto* pass = dynamic_cast<const Pass*>(c)) std::cout << "      " << pass_details(*pass) << "\n";
      if (const auto* loads = dynamic_cast<const LoadsHfModelTypes*>(c)) {
        std::string types;
        for (const auto& type : loads->hf_model_types()) types += (types.empty() ? "" : ", ") + type;
        std::cout << "      loads config.json model_type " << types << " ([job] model may then be left out)\n";
      }
    }
  }
  return 0;
}

}  // namespace strata::cli
