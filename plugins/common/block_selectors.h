// Block selectors, shared by the passes that take them (act_checkpoint's `blocks`, fsdp's `wrap`
// and `ignored`): an entry names a block (`h3`) or a block type (`block`), as
// nn::Model::find_blocks reads it. An entry that matches no block on any rank is a typo that
// would leave those blocks as they were without a word, so it is refused with the line below.
// Header-only and internal to the bundled plugins: nothing here is part of the plugin ABI.
#pragma once

#include <algorithm>
#include <string>

#include "strata/errors.h"
#include "strata/job.h"
#include "strata/model.h"

namespace strata::block_selectors {

inline std::string quoted_list(const StringList& list) {
  std::string out;
  for (const auto& s : list) out += (out.empty() ? "\"" : ", \"") + s + "\"";
  return out;
}

// The blocks a selector may name, for the refusal. Under a pipeline a rank holds its stages'
// blocks only, and every rank must say the same line.
inline std::string block_kinds(const Job& job) {
  if (job.topology && job.topology->size(Dim::Pipeline) > 1) return "`strata plan` lists each pipeline stage's blocks";
  const nn::Model& model = *job.model;
  StringList types;
  for (size_t b = 0; b < model.num_blocks(); ++b)
    if (std::find(types.begin(), types.end(), model.block(b).type()) == types.end()) types.push_back(model.block(b).type());
  const size_t n = model.num_blocks();
  return "types " + quoted_list(types) + "; names such as " +
         quoted_list({model.block_name(0), model.block_name(std::min<size_t>(1, n - 1)), model.block_name(n - 1)});
}

// Refuses the first of `selectors` (the pass's `key` entry) that no rank's blocks match.
// Collective when the job has more than one rank: every rank calls it with the same selectors.
inline void refuse_unmatched(const Job& job, const std::string& pass, const std::string& key, const StringList& selectors) {
  for (const auto& selector : selectors)
    if (!found_on_any_rank(job, !job.model->find_blocks({selector}).empty()))
      throw UserError("pass '" + pass + "': " + key + " entry \"" + selector +
                      "\" is neither the name nor the type of a block of the model (" + block_kinds(job) + ")");
}

}  // namespace strata::block_selectors
