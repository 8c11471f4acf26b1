// Source/target pairs read from JSON lines, a JSON array or CSV, as token ids: text fields by
// ByT5's byte scheme (each UTF-8 byte b is id b + 3, then eos 1; pad is 0, unk 2), fields that
// are lists of ids (what scripts/tokenize --pairs writes for a tokenizer of one's own) as given.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace seq2seq {

constexpr int32_t kPad = 0, kEos = 1, kByteOffset = 3;

struct PairOptions {
  std::string format = "auto";  // auto (by extension, and '[' for a JSON array), jsonl, json, csv
  std::string source_field = "source", target_field = "target";
  int64_t source_len = 128, target_len = 128;  // ids per sample, eos included
  bool truncate = false;                       // cut over-long fields instead of refusing them
};

// Every pair's ids, one flat array with offsets: pair i's source is ids[source_at[i] ..
// source_at[i] + source_n[i]), and likewise its target.
struct Pairs {
  std::vector<int32_t> ids;
  std::vector<int64_t> source_at, target_at;
  std::vector<int32_t> source_n, target_n;
  int64_t size() const { return static_cast<int64_t>(source_at.size()); }
};

// Reads `in` (named `path` in errors). Throws fsdpx::Error naming the row, its line and the
// field for a row without the field, a field that is neither text nor a list of ids, an id that
// is not a positive integer, or a field longer than its length (unless truncating); and the
// file for one that is empty or not of its format.
Pairs read_pairs(std::istream& in, const std::string& path, const PairOptions& o);

// "jsonl", "json" or "csv" for `format` "auto": by the file's extension, and a JSON file whose
// first character is '[' is an array.
std::string detect_format(const std::string& path, std::istream& in);

}  // namespace seq2seq
