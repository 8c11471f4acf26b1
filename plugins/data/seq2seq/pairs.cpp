#include "pairs.h"

#include <fsdpx/error.h>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace seq2seq {
namespace {

using json = nlohmann::json;

// One field of a row: text, or a list of ids.
struct Field {
  bool text = true;
  std::string chars;
  std::vector<int64_t> ids;
};

class PairBuilder {
 public:
  PairBuilder(const std::string& path, const PairOptions& o) : path_(path), o_(o) {}

  [[noreturn]] void fail(int64_t row, int64_t line, const std::string& what) const {
    throw fsdpx::Error("seq2seq file " + path_ + ": row " + std::to_string(row) + " (line " + std::to_string(line) +
                       "): " + what);
  }

  void add(int64_t row, int64_t line, const Field& source, const Field& target) {
    out_.source_at.push_back(static_cast<int64_t>(out_.ids.size()));
    out_.source_n.push_back(append(row, line, source, o_.source_field, o_.source_len, "source_len"));
    out_.target_at.push_back(static_cast<int64_t>(out_.ids.size()));
    out_.target_n.push_back(append(row, line, target, o_.target_field, o_.target_len, "target_len"));
  }

  Pairs take() { return std::move(out_); }

 private:
  // Appends the field's ids (bytes + 3 and eos for text); returns how many.
  int32_t append(int64_t row, int64_t line, const Field& f, const std::string& name, int64_t len, const char* option) {
    const int64_t n = f.text ? static_cast<int64_t>(f.chars.size()) + 1 : static_cast<int64_t>(f.ids.size());
    if (n > len && !o_.truncate)
      fail(row, line,
           "field '" + name + "' has " + std::to_string(n) + " tokens" +
               (f.text ? " (" + std::to_string(n - 1) + " bytes and eos)" : std::string()) + ", more than --data." +
               option + " " + std::to_string(len) + "; raise --data." + option +
               ", or cut long fields with --data.truncate true");
    const int64_t kept = std::min(n, len);
    if (f.text) {
      for (int64_t i = 0; i + 1 < kept; ++i)
        out_.ids.push_back(static_cast<unsigned char>(f.chars[static_cast<size_t>(i)]) + kByteOffset);
      out_.ids.push_back(kEos);
      return static_cast<int32_t>(kept);
    }
    for (size_t i = 0; i < f.ids.size(); ++i)
      if (f.ids[i] < 1 || f.ids[i] > INT32_MAX)
        fail(row, line,
             "field '" + name + "' holds id " + std::to_string(f.ids[i]) + " at position " + std::to_string(i) +
                 "; ids are positive (0 is padding)");
    // A cut list keeps its eos, if it ended with one, as a tokenizer's truncation does.
    const bool eos = kept < n && f.ids.back() == kEos;
    for (int64_t i = 0; i < kept - (eos ? 1 : 0); ++i)
      out_.ids.push_back(static_cast<int32_t>(f.ids[static_cast<size_t>(i)]));
    if (eos) out_.ids.push_back(kEos);
    return static_cast<int32_t>(kept);
  }

  const std::string& path_;
  const PairOptions& o_;
  Pairs out_;
};

const char* json_type(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "a list that is not all integers";
  return "a value";
}

Field json_field(const PairBuilder& b, int64_t row, int64_t line, const json& obj, const std::string& name) {
  if (!obj.is_object()) b.fail(row, line, std::string("is ") + json_type(obj) + ", not a JSON object of fields");
  const auto it = obj.find(name);
  if (it == obj.end()) {
    std::string keys;
    for (const auto& [k, v] : obj.items()) keys += (keys.empty() ? "" : ", ") + k;
    b.fail(row, line,
           "no field '" + name + "' (the row has: " + (keys.empty() ? "nothing" : keys) +
               "); name the field with --data.source_field / --data.target_field");
  }
  Field f;
  if (it->is_string()) {
    f.chars = it->get<std::string>();
    return f;
  }
  bool ids = it->is_array();
  if (ids)
    for (const auto& v : *it) ids = ids && v.is_number_integer();
  if (!ids) b.fail(row, line, "field '" + name + "' is " + json_type(*it) + ", not text or a list of token ids");
  f.text = false;
  for (const auto& v : *it) f.ids.push_back(v.get<int64_t>());
  return f;
}

void read_json_lines(std::istream& in, PairBuilder& b, const PairOptions& o) {
  std::string line;
  int64_t line_no = 0, row = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++row;
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception& e) {
      b.fail(row, line_no, std::string("is not JSON (") + e.what() + ")");
    }
    b.add(row, line_no, json_field(b, row, line_no, j, o.source_field), json_field(b, row, line_no, j, o.target_field));
  }
}

void read_json_array(std::istream& in, const std::string& path, PairBuilder& b, const PairOptions& o) {
  json all;
  try {
    all = json::parse(in);
  } catch (const std::exception& e) {
    throw fsdpx::Error("seq2seq file " + path + " is not JSON: " + e.what());
  }
  if (!all.is_array()) throw fsdpx::Error("seq2seq file " + path + " is JSON but not an array of rows");
  int64_t row = 0;
  for (const auto& j : all) {
    ++row;  // one document: lines are not known, rows are counted from 1
    b.add(row, 1, json_field(b, row, 1, j, o.source_field), json_field(b, row, 1, j, o.target_field));
  }
}

// RFC 4180: fields separated by commas, quoted with '"' (a doubled quote inside is one), quoted
// fields may hold commas and line breaks. Each record with the line it starts on.
struct CsvRecord {
  std::vector<std::string> fields;
  int64_t line = 0;
};

std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& path) {
  std::vector<CsvRecord> records;
  CsvRecord rec;
  std::string field;
  bool quoted = false, any = false;
  int64_t line = 1;
  rec.line = 1;
  auto end_record = [&] {
    if (any || !field.empty() || !rec.fields.empty()) {
      rec.fields.push_back(field);
      records.push_back(rec);
    }
    rec = CsvRecord{{}, line};
    field.clear();
    any = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"')
        field += text[++i];
      else if (c == '"')
        quoted = false;
      else
        field += c;
      if (c == '\n') ++line;
      continue;
    }
    if (c == '"' && field.empty()) {
      quoted = any = true;
    } else if (c == ',') {
      rec.fields.push_back(std::exchange(field, std::string()));
      any = true;
    } else if (c == '\n') {
      ++line;
      end_record();
    } else if (c != '\r') {
      field += c;
    }
  }
  if (quoted)
    throw fsdpx::Error("seq2seq file " + path + ": a quoted field opened on line " + std::to_string(rec.line) +
                       " or later is never closed");
  end_record();
  return records;
}

void read_csv(std::istream& in, const std::string& path, PairBuilder& b, const PairOptions& o) {
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<CsvRecord> records = parse_csv(text, path);
  if (records.empty()) return;
  const std::vector<std::string>& header = records[0].fields;
  auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) {
      std::string names;
      for (const auto& h : header) names += (names.empty() ? "'" : ", '") + h + "'";
      throw fsdpx::Error("seq2seq file " + path + ": the header (line 1) has no column '" + name + "', only " + names +
                         "; name the columns with --data.source_field / --data.target_field");
    }
    return static_cast<size_t>(it - header.begin());
  };
  const size_t s = column(o.source_field), t = column(o.target_field);
  for (size_t r = 1; r < records.size(); ++r) {
    const CsvRecord& rec = records[r];
    const int64_t row = static_cast<int64_t>(r);
    for (auto [col, name] : {std::pair<size_t, const std::string*>{s, &o.source_field}, {t, &o.target_field}})
      if (col >= rec.fields.size())
        b.fail(row, rec.line,
               "no field '" + *name + "': the row has " + std::to_string(rec.fields.size()) +
                   " column(s), the header " + std::to_string(header.size()));
    Field source, target;
    source.chars = rec.fields[s];
    target.chars = rec.fields[t];
    b.add(row, rec.line, source, target);
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string detect_format(const std::string& path, std::istream& in) {
  if (ends_with(path, ".csv")) return "csv";
  if (!ends_with(path, ".json")) return "jsonl";
  char c = 0;
  while (in.get(c) && std::isspace(static_cast<unsigned char>(c))) {}
  in.clear();
  in.seekg(0);
  return c == '[' ? "json" : "jsonl";
}

Pairs read_pairs(std::istream& in, const std::string& path, const PairOptions& o) {
  const std::string format = o.format == "auto" ? detect_format(path, in) : o.format;
  PairBuilder b(path, o);
  if (format == "csv")
    read_csv(in, path, b, o);
  else if (format == "json")
    read_json_array(in, path, b, o);
  else
    read_json_lines(in, b, o);
  Pairs p = b.take();
  if (p.size() == 0) throw fsdpx::Error("seq2seq file " + path + " holds no pairs (data.path)");
  return p;
}

}  // namespace seq2seq
