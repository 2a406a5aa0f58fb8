// Prepared data and the weights it fine-tunes must share one tokenizer.
//
// A token id means a piece of text only through the tokenizer that made it. Weights carry theirs
// (tokenizer.json beside [model] init_from: the hub's, or the one `strata ckpt export` copied), and
// a directory `strata data prepare` wrote carries the one its ids came from. Where both exist and
// their vocabularies differ (another token at some id), training would teach the weights other
// text under the same ids and still lower the loss, and the export would pair the weights with the
// data's tokenizer: so `strata plan` refuses it, naming both files, an id they disagree on and the
// command that prepares the data with the weights' tokenizer. Only the vocabulary and the added
// tokens are compared (which ids name which strings), not formatting or the merges' order. The
// text dataset's ids are bytes, so there the weights' tokenizer must be a byte-level run's (the
// one `strata ckpt export` writes for it): a hub GPT-2 fine-tuned on a text file is refused with
// the `strata data prepare` that tokenizes the file with the weights' tokenizer.
#pragma once

#include "strata/core/strategy.h"

namespace strata {

// `job`: the resolved [job] (its dataset); `model`, `data`: the sections as written.
void check_data_tokenizer_matches_weights(const Config& job, const RawSection& model, const RawSection& data, Diagnostics& diagnostics);

}  // namespace strata
