// The layer registry's table (lib/layers/registry.h).
#include "lib/layers/registry.h"

#include <algorithm>
#include <deque>
#include <mutex>

#include "lib/core/check.h"

namespace hn {
namespace detail {
std::vector<LayerType> builtin_layer_types();  // lib/layers/builtin.cpp
}  // namespace detail

namespace {

struct Registry {
  std::mutex mutex;
  std::deque<LayerType> types;  // a deque: entries keep their address as types are added
};

void add_locked(Registry& registry, LayerType type) {
  HN_CHECK(!type.name.empty(), "register_layer_type: a layer type needs a name");
  HN_CHECK(static_cast<bool>(type.make), "register_layer_type: layer type '{}' has no make",
           type.name);
  for (const LayerType& present : registry.types) {
    HN_CHECK(present.name != type.name,
             "register_layer_type: a layer type '{}' is already registered", type.name);
  }
  registry.types.push_back(std::move(type));
}

// The built-in types go in at the first use (the same floor lists them: no static
// initialiser needed).
Registry& registry() {
  static Registry table;
  static std::once_flag filled;
  std::call_once(filled, [] {
    for (LayerType& type : detail::builtin_layer_types())
      add_locked(table, std::move(type));
  });
  return table;
}

}  // namespace

void register_layer_type(LayerType type) {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  add_locked(table, std::move(type));
}

const LayerType* find_layer_type(std::string_view name) {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  for (const LayerType& type : table.types) {
    if (type.name == name) return &type;
  }
  return nullptr;
}

std::vector<std::string> layer_type_names() {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  std::vector<std::string> names;
  for (const LayerType& type : table.types)
    names.push_back(type.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace hn
