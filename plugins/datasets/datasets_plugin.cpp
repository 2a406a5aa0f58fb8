// Datasets: token files, byte-level text and synthetic tokens, configured by [data].
#include "strata/plugin.h"

namespace strata::datasets {
namespace {

Schema with_split(Schema schema) {
  return schema.real("val_fraction", 0.05, "Share of the data held out for evaluation", between(0, 0.5))
      .boolean("shuffle", true, "Shuffle sample order deterministically from [job] seed");
}

void register_components(Registry& registry) {
  registry.add(std::make_unique<Component>(ComponentInfo{
      ComponentKind::Dataset, "tokens", "Memory-mapped token files (nanoGPT's raw little-endian uint16, or uint32)",
      with_split(Schema()
                     .required_string("path", "Token file, or directory with train.bin and val.bin")
                     .string("dtype", "uint16", "Token width in the file", {"uint16", "uint32"}))}));
  registry.add(std::make_unique<Component>(ComponentInfo{
      ComponentKind::Dataset, "text", "Byte-level tokens (vocabulary 256) of UTF-8 text files",
      with_split(Schema().required_string("path", "Text file or directory of .txt files"))}));
  registry.add(std::make_unique<Component>(ComponentInfo{
      ComponentKind::Dataset, "synthetic", "Random tokens for benchmarks",
      Schema()
          .integer("vocab_size", 50257, "Token ids are drawn from [0, vocab_size)", at_least(1))
          .integer("num_tokens", 1 << 20, "Tokens in the synthetic stream", at_least(2))}));
}

}  // namespace
}  // namespace strata::datasets

STRATA_PLUGIN("datasets", "0.1.0", strata::datasets::register_components)
