// Options: declared types, defaults, canonical text, and the errors for bad values.
#include <functional>

#include <gtest/gtest.h>

#include "test_paths.h"

#include "fsdpx/error.h"
#include "fsdpx/options.h"
#include "fsdpx/framework/base/suggest.h"

namespace fsdpx {
namespace {

std::vector<OptionSpec> specs() {
  return {flag_option("overlap", true, "overlap communication"),
          int_option("limit", 8, "a count"),
          float_option("lr", 3e-4, "learning rate"),
          string_option("label", "run", "free text"),
          choice_option("dtype", "fp32", {"fp32", "bf16", "fp16"}, "a dtype"),
          list_option("layers", "Block,Embedding", "class names")};
}

using test::error_of;

const char* kOwner = "optimizer 'x' (plugin p)";

TEST(Options, DefaultsFillEveryOption) {
  Options o(kOwner, "optimizer", specs(), {});
  EXPECT_TRUE(o.get_bool("overlap"));
  EXPECT_EQ(o.get_int("limit"), 8);
  EXPECT_DOUBLE_EQ(o.get_float("lr"), 3e-4);
  EXPECT_EQ(o.get_string("label"), "run");
  EXPECT_EQ(o.get_string("dtype"), "fp32");
  EXPECT_EQ(o.get_list("layers"), (std::vector<std::string>{"Block", "Embedding"}));
  EXPECT_FALSE(o.was_given("limit"));
}

TEST(Options, GivenValuesParseAndCanonicalise) {
  Options o(kOwner, "optimizer", specs(),
            {{"overlap", "Off"}, {"limit", "+12"}, {"lr", "1e-3"}, {"dtype", "bf16"},
             {"layers", " A , B,,C "}});
  EXPECT_FALSE(o.get_bool("overlap"));
  EXPECT_EQ(o.get_int("limit"), 12);
  EXPECT_DOUBLE_EQ(o.get_float("lr"), 1e-3);
  EXPECT_EQ(o.get_list("layers"), (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_TRUE(o.was_given("limit"));
  EXPECT_EQ(o.text().at("overlap"), "false");
  EXPECT_EQ(o.text().at("limit"), "12");
  EXPECT_EQ(o.text().at("lr"), "0.001");
  EXPECT_EQ(o.text().at("layers"), "A,B,C");
}

TEST(Options, BadValuesNameOptionAndExpectedType) {
  auto with = [](const char* k, const char* v) {
    return error_of([&] { Options(kOwner, "optimizer", specs(), {{k, v}}); });
  };
  EXPECT_EQ(with("overlap", "maybe"),
            "optimizer 'x' (plugin p): option optimizer.overlap expects a boolean (true/false, "
            "yes/no, on/off, 1/0), got 'maybe'");
  EXPECT_EQ(with("limit", "1.5"),
            "optimizer 'x' (plugin p): option optimizer.limit expects an integer, got '1.5'");
  EXPECT_EQ(with("limit", "99999999999999999999"),
            "optimizer 'x' (plugin p): option optimizer.limit expects an integer, got "
            "'99999999999999999999' (out of the 64-bit range)");
  EXPECT_EQ(with("lr", "fast"),
            "optimizer 'x' (plugin p): option optimizer.lr expects a finite number, got 'fast'");
  EXPECT_EQ(with("limit", "+-5"),
            "optimizer 'x' (plugin p): option optimizer.limit expects an integer, got '+-5'");
  EXPECT_EQ(with("label", "a#b"),
            "optimizer 'x' (plugin p): option optimizer.label cannot hold '#', a newline, or "
            "leading/trailing spaces (an INI file could not reproduce it), got 'a#b'");
  EXPECT_EQ(with("lr", "inf"),
            "optimizer 'x' (plugin p): option optimizer.lr expects a finite number, got 'inf'");
  EXPECT_EQ(with("dtype", "bf61"),
            "optimizer 'x' (plugin p): option optimizer.dtype expects one of fp32, bf16, fp16, "
            "got 'bf61'; did you mean 'bf16'?");
}

TEST(Options, UnknownOptionSuggestsAndLists) {
  EXPECT_EQ(error_of([] { Options(kOwner, "optimizer", specs(), {{"limt", "1"}}); }),
            "optimizer 'x' (plugin p) has no option 'limt' (given as optimizer.limt); did you mean "
            "'limit'? Its options: overlap, limit, lr, label, dtype, layers.");
  EXPECT_EQ(error_of([] { Options(kOwner, "optimizer", specs(), {{"zzzzzz", "1"}}); }),
            "optimizer 'x' (plugin p) has no option 'zzzzzz' (given as optimizer.zzzzzz). Its "
            "options: overlap, limit, lr, label, dtype, layers.");
}

TEST(Options, ReadingWithTheWrongTypeIsAPluginBug) {
  Options o(kOwner, "optimizer", specs(), {});
  EXPECT_EQ(error_of([&] { o.get_int("lr"); }),
            "optimizer 'x' (plugin p) read option 'lr' as int but declared it as float (a bug in "
            "the plugin)");
  EXPECT_EQ(error_of([&] { o.get_int("nope"); }),
            "optimizer 'x' (plugin p) read option 'nope', which it never declared (a bug in the "
            "plugin)");
}

// The layer types listed in --activation-checkpointing's error, without repeats: whole names
// compare, so a type whose name is inside another's ("Block" in "AttnBlock") is still listed.
TEST(Suggest, DistinctComparesWholeNames) {
  EXPECT_EQ(join_names(distinct({"AttnBlock", "Block", "AttnBlock", "Block"})), "AttnBlock, Block");
  EXPECT_EQ(join_names(distinct({"Block", "AttnBlock"})), "Block, AttnBlock");
  EXPECT_EQ(join_names(distinct({})), "(none)");
}

}  // namespace
}  // namespace fsdpx
