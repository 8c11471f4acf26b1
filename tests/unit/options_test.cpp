// Options: declared types, defaults, canonical text, and the errors for bad values.
#include <functional>

#include <gtest/gtest.h>

#include "test_paths.h"

#include "fsdpx/error.h"
#include "fsdpx/options.h"
#include "fsdpx/suggest.h"

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

// A numeric option's declared range: values outside it are refused with the range, integers
// printed as integers; the range is read back from the spec, and a malformed one is a plugin bug.
TEST(Options, DeclaredRangesAreCheckedAndNamed) {
  const std::vector<OptionSpec> ranged = {int_option("limit", 8, {1, 64}, "a count"),
                                          int_option("seed", 0, IntRange{0}, "a seed"),
                                          float_option("lr", 3e-4, FloatRange::above(0), "learning rate"),
                                          float_option("ratio", 0.5, FloatRange{0, 1, true, true}, "a fraction")};
  auto with = [&](const char* k, const char* v) {
    return error_of([&] { Options(kOwner, "optimizer", ranged, {{k, v}}); });
  };
  const std::string head = "optimizer 'x' (plugin p): option optimizer.";
  EXPECT_EQ(with("limit", "0"), head + "limit expects an integer in [1, 64], got '0'");
  EXPECT_EQ(with("limit", "65"), head + "limit expects an integer in [1, 64], got '65'");
  EXPECT_EQ(with("seed", "-1"), head + "seed expects an integer of at least 0, got '-1'");
  EXPECT_EQ(with("lr", "0"), head + "lr expects a number greater than 0, got '0'");
  EXPECT_EQ(with("ratio", "1"), head + "ratio expects a number in (0, 1), got '1'");
  EXPECT_EQ(Options(kOwner, "optimizer", ranged, {{"limit", "64"}, {"ratio", "0.25"}}).get_int("limit"), 64);
  EXPECT_EQ(int_range(ranged[0])->max, 64);
  EXPECT_TRUE(float_range(ranged[2])->min_open);
  EXPECT_FALSE(int_range(int_option("any", 1, "no range")));
  OptionSpec broken = int_option("n", 1, "x");
  broken.choices = {"[1", "oops]"};
  EXPECT_EQ(error_of([&] { int_range(broken); }), "option 'n' declares a malformed range (a bug in the plugin)");
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

// A name moved into a module ("output" -> "output.weight", as gpt's embedding and output projection
// moved), or out of one, is suggested though its edit distance is long; two such
// candidates suggest neither, and typos are suggested by edit distance as before.
TEST(Suggest, ANameMovedIntoOrOutOfAModuleIsSuggested) {
  const std::vector<std::string> now = {"tok_embeddings.weight", "norm.weight", "output.weight"};
  EXPECT_EQ(did_you_mean("output", now), "; did you mean 'output.weight'?");
  EXPECT_EQ(did_you_mean("tok_embeddings", now), "; did you mean 'tok_embeddings.weight'?");
  EXPECT_EQ(did_you_mean("output.weight", {"tok_embeddings", "output"}), "; did you mean 'output'?");
  EXPECT_EQ(did_you_mean("norm", {"norm.weight", "norm.bias"}), "");
  EXPECT_EQ(did_you_mean("outptu.weight", now), "; did you mean 'output.weight'?");
  EXPECT_EQ(did_you_mean("layers", now), "");
  EXPECT_EQ(moved_name("output", now), "output.weight");
  EXPECT_EQ(moved_name("outptu.weight", now), std::nullopt);  // a typo, not a move
  EXPECT_EQ(moved_name("layers.2.attention_norm.weight", {"layers.1.attention_norm.weight"}), std::nullopt);
}

}  // namespace
}  // namespace fsdpx
