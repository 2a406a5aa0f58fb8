// Schemas and configs as plugins see them.
#include <gtest/gtest.h>

#include "strata/config.h"

namespace strata {
namespace {

TEST(Config, SchemaRejectsDuplicateKeys) {
  Schema schema;
  schema.integer("a", 1, "doc");
  EXPECT_THROW(schema.real("a", 1.0, "doc"), std::logic_error);
}

TEST(Config, TypedAccessWidensIntegersOnly) {
  Config config;
  config.set("n", {Value{int64_t{3}}, Origin::File, {}});
  config.set("x", {Value{2.5}, Origin::Default, {}});
  config.set("auto", {Value{std::string("auto")}, Origin::Default, {}});
  EXPECT_EQ(config.get_int("n"), 3);
  EXPECT_DOUBLE_EQ(config.get_float("n"), 3.0);
  EXPECT_THROW(config.get_int("x"), std::logic_error);
  EXPECT_TRUE(config.is_auto("auto"));
  EXPECT_FALSE(config.is_auto("n"));
  EXPECT_THROW(config.entry("missing"), std::out_of_range);
}

TEST(Config, ValuesPrintAsToml) {
  EXPECT_EQ(value_to_toml(Value{true}), "true");
  EXPECT_EQ(value_to_toml(Value{int64_t{-7}}), "-7");
  EXPECT_EQ(value_to_toml(Value{3.0}), "3.0");
  EXPECT_EQ(value_to_toml(Value{0.1}), "0.1");
  EXPECT_EQ(value_to_toml(Value{1e-8}), "1e-08");
  EXPECT_EQ(value_to_toml(Value{std::string("a\"b")}), "\"a\\\"b\"");
  EXPECT_EQ(value_to_toml(Value{StringList{"x", "y"}}), "[\"x\", \"y\"]");
}

TEST(Config, DiagnosticsFormatOneLineEach) {
  Diagnostics d;
  d.error({"f.toml", 3, 7}, "bad thing");
  d.error({"--set job.x=1", 0, 0}, "worse thing");
  EXPECT_EQ(d.str(), "f.toml:3:7: error: bad thing\n--set job.x=1: error: worse thing\n");
}

}  // namespace
}  // namespace strata
