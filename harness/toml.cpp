// TomlNode from and to toml++ (harness/toml.hpp says why toml++ stays in this file).
#include "harness/toml.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <sstream>

namespace minicp::harness {
namespace {

TomlNode from_toml(const toml::node& n) {
  TomlNode out;
  switch (n.type()) {
    case toml::node_type::string:
      out.type = TomlNode::Type::String;
      out.string = *n.value_exact<std::string>();
      break;
    case toml::node_type::integer:
      out.type = TomlNode::Type::Integer;
      out.integer = *n.value_exact<int64_t>();
      break;
    case toml::node_type::floating_point:
      out.type = TomlNode::Type::Float;
      out.number = *n.value_exact<double>();
      break;
    case toml::node_type::boolean:
      out.type = TomlNode::Type::Boolean;
      out.boolean = *n.value_exact<bool>();
      break;
    case toml::node_type::array:
      out.type = TomlNode::Type::Array;
      for (const toml::node& e : *n.as_array()) out.array.push_back(from_toml(e));
      break;
    case toml::node_type::table:
      out.type = TomlNode::Type::Table;
      for (const auto& [k, v] : *n.as_table()) out.table.emplace_back(std::string(k.str()), from_toml(v));
      break;
    default: out.type = TomlNode::Type::DateTime; break;  // read, never written back
  }
  return out;
}

void insert(toml::table& t, const std::string& key, const TomlNode& v);
void push(toml::array& a, const TomlNode& v);

toml::table to_table(const TomlNode& n) {
  toml::table t;
  for (const auto& [k, v] : n.table) insert(t, k, v);
  return t;
}
toml::array to_array(const TomlNode& n) {
  toml::array a;
  for (const TomlNode& e : n.array) push(a, e);
  return a;
}

template <class Put>
void put(const TomlNode& v, Put&& p) {
  switch (v.type) {
    case TomlNode::Type::String: p(v.string); break;
    case TomlNode::Type::Integer: p(v.integer); break;
    case TomlNode::Type::Float: p(v.number); break;
    case TomlNode::Type::Boolean: p(v.boolean); break;
    case TomlNode::Type::Array: p(to_array(v)); break;
    case TomlNode::Type::Table: p(to_table(v)); break;
    case TomlNode::Type::DateTime: throw std::logic_error("format_toml: a date or time is not written back");
  }
}
void insert(toml::table& t, const std::string& key, const TomlNode& v) {
  put(v, [&](auto&& x) { t.insert_or_assign(key, std::forward<decltype(x)>(x)); });
}
void push(toml::array& a, const TomlNode& v) {
  put(v, [&](auto&& x) { a.push_back(std::forward<decltype(x)>(x)); });
}

}  // namespace

TomlNode TomlNode::of(std::string s) {
  TomlNode n;
  n.type = Type::String;
  n.string = std::move(s);
  return n;
}
TomlNode TomlNode::of(int64_t i) {
  TomlNode n;
  n.type = Type::Integer;
  n.integer = i;
  return n;
}
TomlNode TomlNode::of(double d) {
  TomlNode n;
  n.type = Type::Float;
  n.number = d;
  return n;
}

const TomlNode* TomlNode::get(const std::string& key) const {
  if (type != Type::Table) return nullptr;
  for (const auto& [k, v] : table)
    if (k == key) return &v;
  return nullptr;
}
TomlNode* TomlNode::get(const std::string& key) {
  return const_cast<TomlNode*>(static_cast<const TomlNode*>(this)->get(key));
}

TomlNode& TomlNode::set(const std::string& key, TomlNode value) {
  if (type != Type::Table) throw std::logic_error("TomlNode::set: not a table");
  auto at = std::lower_bound(table.begin(), table.end(), key,
                             [](const auto& e, const std::string& k) { return e.first < k; });
  if (at != table.end() && at->first == key)
    at->second = std::move(value);
  else
    at = table.emplace(at, key, std::move(value));
  return at->second;
}

const char* TomlNode::type_name() const {
  switch (type) {
    case Type::String: return "a string";
    case Type::Integer: return "an integer";
    case Type::Float: return "a number";
    case Type::Boolean: return "a boolean";
    case Type::Array: return "an array";
    case Type::Table: return "a table";
    case Type::DateTime: return "a date or time";
  }
  return "a value";
}

TomlNode parse_toml(const std::string& text, const std::string& source) {
  try {
    return from_toml(toml::parse(text, source));
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw TomlError(std::string(e.description()), int(b.line), int(b.column));
  }
}

std::string format_toml(const TomlNode& node) {
  std::ostringstream os;
  if (node.is_table()) {
    os << to_table(node);
    return os.str();
  }
  toml::table t;
  insert(t, "v", node);
  os << t;
  std::string line = os.str();  // "v = <value>"
  line = line.substr(line.find('=') + 2);
  while (!line.empty() && line.back() == '\n') line.pop_back();
  return line;
}

}  // namespace minicp::harness
