// [job] model and dataset chosen by the files a strategy names, where it leaves them out.
//
// Weights say which architecture they are in the config.json beside them (`model_type`, what
// transformers' AutoModel reads to pick a class), and a [data] path says what it holds: a
// directory `strata data prepare` wrote, a .bin file or a train.bin/val.bin directory is token
// files; a .txt file or a directory of .txt files is text. So a strategy whose [model] init_from has a config.json needs no [job] model: the
// one registered model that declares it loads that model_type (strata/component.h,
// LoadsHfModelTypes, plugin ABI 1.7) is chosen; and one whose [data] path is one of those needs no
// [job] dataset: `tokens` or `text` reads it. Each choice is an entry of origin File
// at the file it came from, so `strata plan` prints that file beside it and the saved strategy
// states it. A stated key is kept (the model's own checks refuse weights of another model_type).
// Where no single registered model loads the model_type nothing is chosen, and [job]'s missing
// key is reported as before (its documentation says when it may be left out).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "strata/core/component_registry.h"
#include "strata/core/strategy.h"

namespace strata {

// The file `name` (config.json, tokenizer.json) in the [model] init_from directory, or beside the
// file (or sharded index) it names, as the models' HfConfigCheck finds config.json; empty if none.
std::filesystem::path beside_weights(const std::string& init_from, const std::string& name);

// The registered models that declare they load config.json's `model_type`.
std::vector<std::string> models_loading(const std::string& model_type, const ComponentRegistry& registry);

void choose_components_from_files(RawSection& job, const RawSection& model, const RawSection& data,
                                  const ComponentRegistry& registry);

}  // namespace strata
