// fuzz_plan: the plan JSON reader (what kat::plan::read_plan runs on a file's text:
// nlohmann::json::parse, then kat::plan::plan_from_json) on arbitrary bytes. The seeds
// (fuzz/corpus/plan) are plans written by kat::plan::write_plan, as kat_plan writes them.
//
// Beyond not crashing (and no undefined behaviour: a number converted to an integer field
// must fit), an accepted plan must survive what kat_plan and the executor do with it: written
// back as JSON (plan_to_json, write_plan's dump) and read again, it must be accepted and give
// the same JSON; and what it read must be what the input says: every value the plan writes
// back equals the input's value at the same place (an integer field given 2^32 + 1 or 2.5
// must be refused, not read as 1 or 2), except the memory totals, which the writer computes.
#include "common.hpp"

#include "kat/plan/plan_io.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <string>

namespace {

// The one place that hands the bytes to the reader: read_plan's steps after reading the file.
kat::plan::Plan parse(const std::uint8_t *data, std::size_t size) {
  return kat::plan::plan_from_json(nlohmann::json::parse(data, data + size));
}

kat_fuzz::Counts counts("fuzz_plan");

// The first place (a JSON pointer) where `written` holds a value `input` does not, or "".
std::string first_difference(const nlohmann::json &written, const nlohmann::json &input,
                             const std::string &where) {
  if (written.is_object()) {
    if (!input.is_object()) {
      return where;
    }
    for (auto it = written.begin(); it != written.end(); ++it) {
      if (it.key() == "total" && where.size() >= 13 &&
          where.compare(where.size() - 13, 13, "/memory_bytes") == 0) {
        continue; // written as the sum of the parts, never read
      }
      if (!input.contains(it.key())) {
        return where + "/" + it.key();
      }
      const std::string d = first_difference(*it, input[it.key()], where + "/" + it.key());
      if (!d.empty()) {
        return d;
      }
    }
    return "";
  }
  if (written.is_array()) {
    if (!input.is_array() || input.size() != written.size()) {
      return where;
    }
    for (std::size_t i = 0; i < written.size(); ++i) {
      const std::string d = first_difference(written[i], input[i], where + "/" + std::to_string(i));
      if (!d.empty()) {
        return d;
      }
    }
    return "";
  }
  return written == input ? "" : where; // numbers compare by value across int and float
}

void check(const kat::plan::Plan &p, const std::uint8_t *data, std::size_t size) {
  const nlohmann::json written = kat::plan::plan_to_json(p);
  const std::string where = first_difference(written, nlohmann::json::parse(data, data + size), "");
  if (!where.empty()) {
    kat_fuzz::finding("the plan read holds at %s a value other than the input's", where.c_str());
  }
  const std::string text = written.dump(2);
  std::string again;
  try {
    again = kat::plan::plan_to_json(kat::plan::plan_from_json(nlohmann::json::parse(text))).dump(2);
  } catch (const std::exception &e) {
    kat_fuzz::finding("an accepted plan, written back, is refused: %s\n%s", e.what(), text.c_str());
  }
  if (again != text) {
    kat_fuzz::finding("an accepted plan, written back and read again, changes:\n%s\n---\n%s",
                      text.c_str(), again.c_str());
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  return counts.run(data, size, parse, check);
}
