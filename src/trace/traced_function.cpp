#include "retrace/traced_function.hpp"

#include <algorithm>
#include <atomic>

namespace retrace {

namespace {
std::atomic<std::uint64_t> g_next_owner_id{1};
}  // namespace

TraceOwner::TraceOwner() noexcept : id_(g_next_owner_id.fetch_add(1)) {}

TraceOwner::TraceOwner(const TraceOwner&) noexcept : TraceOwner() {}

TraceOwner& TraceOwner::operator=(const TraceOwner& other) noexcept {
  if (this != &other) {
    release_traces();
    id_ = g_next_owner_id.fetch_add(1);
  }
  return *this;
}

TraceOwner::~TraceOwner() { release_traces(); }

void TraceOwner::release_traces() noexcept {
  decltype(releases_) releases;
  {
    std::lock_guard lock(mutex_);
    releases.swap(releases_);
  }
  for (auto& [cache, release] : releases) {
    if (cache.expired()) continue;
    try {
      release(id_);
    } catch (const std::exception& e) {
      log(LogLevel::error, "releasing the traces of a destroyed object failed: {}", e.what());
    }
  }
}

void TraceOwner::on_destroy(std::weak_ptr<void> cache,
                            std::function<void(std::uint64_t)> release) {
  std::lock_guard lock(mutex_);
  std::erase_if(releases_, [](const auto& entry) { return entry.first.expired(); });
  releases_.emplace_back(std::move(cache), std::move(release));
}

namespace detail {

bool CacheKey::involves(std::uint64_t owner_id) const noexcept {
  return owner == owner_id ||
         std::find(bound_owners.begin(), bound_owners.end(), owner_id) != bound_owners.end();
}

std::size_t CacheKeyHash::operator()(const CacheKey& key) const noexcept {
  std::size_t seed = std::hash<std::uint64_t>{}(key.owner);
  auto combine = [&](std::size_t v) { seed ^= v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2); };
  combine(std::hash<std::uint64_t>{}(key.device));
  for (std::uint64_t b : key.bound_owners) combine(std::hash<std::uint64_t>{}(b));
  for (std::uintptr_t b : key.bound_addresses) combine(std::hash<std::uintptr_t>{}(b));
  combine(key.key.hash());
  if (key.signature) combine(key.signature->hash);
  return seed;
}

std::string CacheBook::explain(const CacheKey& key, const std::vector<const CacheKey*>& live,
                               const std::function<std::string(std::size_t)>& path_of) const {
  if (live.empty()) return "first traced call";
  std::vector<const CacheKey*> same_context;
  for (const CacheKey* k : live) {
    if (k->owner == key.owner && k->device == key.device && k->bound_owners == key.bound_owners &&
        k->bound_addresses == key.bound_addresses) {
      same_context.push_back(k);
    }
  }
  if (same_context.empty()) {
    return key.owner != 0 ? "first traced call for this object (or on this device)"
                                : "new device or bound arguments (traces are chosen by their "
                                  "identity)";
  }
  std::vector<const CacheKey*> same_key;
  for (const CacheKey* k : same_context) {
    if (k->key == key.key) same_key.push_back(k);
  }
  if (same_key.empty()) return fmt::format("new trace key {}", key.key.to_string());
  if (!key.signature) return "the previous trace was released";
  // Automatic keys: name the first leaf that differs from the nearest existing signature.
  const InputSignature& wanted = *key.signature;
  const InputSignature* nearest = nullptr;
  for (const CacheKey* k : same_key) {
    if (!k->signature) continue;
    if (nearest == nullptr ||
        k->signature->matching_leaves(wanted) > nearest->matching_leaves(wanted)) {
      nearest = &*k->signature;
    }
  }
  if (nearest == nullptr) return "new input signature";
  for (std::size_t i = 0; i < wanted.leaves.size() && i < nearest->leaves.size(); ++i) {
    if (wanted.leaves[i] == nearest->leaves[i]) continue;
    return fmt::format("new input signature: input {} is {}, the nearest trace has {}",
                       path_of(i), wanted.leaves[i].describe(), nearest->leaves[i].describe());
  }
  return fmt::format("new input signature: the input has {} leaves, the nearest trace {} (a "
                     "container changed size or keys)",
                     wanted.leaves.size(), nearest->leaves.size());
}

std::vector<std::size_t> TraceBounds::victims(std::span<const Entry> entries,
                                              std::size_t newest) const {
  std::size_t count = entries.size(), bytes = 0;
  for (const Entry& e : entries) bytes += e.bytes;
  std::vector<std::size_t> order(entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return entries[a].last_used < entries[b].last_used;
  });
  std::vector<std::size_t> out;
  for (std::size_t i : order) {
    const bool over = (max_traces_ != 0 && count > max_traces_) ||
                      (max_trace_bytes_ != 0 && bytes > max_trace_bytes_ && count > 1);
    if (!over) break;
    if (i == newest) continue;
    out.push_back(i);
    --count;
    bytes -= entries[i].bytes;
  }
  return out;
}

void CacheBook::note_call(bool captured) {
  constexpr std::size_t kWindow = 10;
  constexpr std::size_t kLimit = 5;
  recent_.push_back(captured);
  if (recent_.size() > kWindow) recent_.pop_front();
  ++calls_since_warning_;
  const auto captures = static_cast<std::size_t>(std::count(recent_.begin(), recent_.end(), true));
  if (recent_.size() == kWindow && captures > kLimit && calls_since_warning_ >= kWindow) {
    calls_since_warning_ = 0;
    log(LogLevel::warning,
        "{}: {} of the last {} calls captured a new trace; traces are not being reused (do "
        "shapes or scalar arguments keep changing? use a trace key per shape, or pass changing "
        "values as tensors)",
        options_.name, captures, kWindow);
  }
}

}  // namespace detail
}  // namespace retrace
