// TOML documents as the programs read decks and write them back. No toml++ type crosses this
// header: toml++ stays in toml.cpp, in the Kokkos-free part of the harness, because nvcc's
// front end refuses its headers and every file that includes Kokkos goes through nvcc when
// Kokkos is built for CUDA.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace minicp::harness {

struct TomlNode {
  enum class Type { String, Integer, Float, Boolean, Array, Table, DateTime };
  Type type = Type::Table;
  std::string string;                                   // String
  int64_t integer = 0;                                  // Integer
  double number = 0;                                    // Float
  bool boolean = false;                                 // Boolean
  std::vector<TomlNode> array;                          // Array
  std::vector<std::pair<std::string, TomlNode>> table;  // Table: sorted by key, as toml++ keeps it

  static TomlNode of(std::string s);
  static TomlNode of(int64_t i);
  static TomlNode of(double d);
  template <class T>
  static TomlNode of(const std::vector<T>& v) {
    TomlNode a;
    a.type = Type::Array;
    for (const T& e : v) a.array.push_back(of(e));
    return a;
  }

  bool is_table() const { return type == Type::Table; }
  // The value under key; nullptr when this is not a table or has no such key.
  const TomlNode* get(const std::string& key) const;
  TomlNode* get(const std::string& key);
  // Inserts or replaces the value under key (this must be a table); returns it.
  TomlNode& set(const std::string& key, TomlNode value);
  // "a string", "an integer", "a number", ... for messages about a value of the wrong type.
  const char* type_name() const;
};

// A document that is not TOML: what() is toml++'s description; line and column are 1-based.
struct TomlError : std::runtime_error {
  TomlError(const std::string& what, int line, int column) : std::runtime_error(what), line(line), column(column) {}
  int line, column;
};

// The document in text (source names it in toml++'s messages). Throws TomlError.
TomlNode parse_toml(const std::string& text, const std::string& source = "");
// A table as a TOML document, in toml++'s layout (keys sorted); any other value as TOML
// writes it on the right of `key = `.
std::string format_toml(const TomlNode& node);

}  // namespace minicp::harness
