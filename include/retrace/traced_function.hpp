// Traced functions and methods: wrappers that capture on the first call and replay afterwards,
// with several traces per wrapper selected by a key (any string, integer or tuple of them).
// They speak the Tracer's vocabulary: operator() is a traced call, call(CallOptions, ...) one
// with options, untraced(...) the plain function call (no overhead), TraceOptions configure them.
//
// Three ways to find the device, as in the ttnn decorator:
//
//  1. Context-bound methods. The device comes from the object; each object has its own traces,
//     released when it is destroyed (the class derives from retrace::TraceOwner):
//
//       struct Pipeline : retrace::TraceOwner {
//         Device* device;
//         Tensor step(const Tensor& x, float t) { ... }
//       };
//       auto step = retrace::traced_method(&Pipeline::step,
//                                          [](Pipeline& p) -> Device& { return *p.device; });
//       step.untraced(pipeline, x, 0.5f);  // a plain call
//       step(pipeline, x, 0.5f);           // traced
//
//  2. A device parameter. A free function takes a `Device&` (found by its type). Parameters that
//     are not trees (a manager, a callback, a config struct without RETRACE_FIELDS) are bound,
//     and the trace is chosen by their identity and the device's: they are references or
//     pointers to a retrace::TraceOwner, std::shared_ptrs, or function pointers:
//
//       Tensor attention(const Tensor& x, Device& device, const CclManager& ccl);
//       auto traced_attention = retrace::traced_function(attention);
//       traced_attention(x, device, ccl);
//
//  3. An injected device. The function takes no device; the wrapper is given one per call as
//     the first argument:
//
//       auto traced_gelu = retrace::traced_function_injected(gelu);
//       traced_gelu(device, x);
//
// Per call (call(CallOptions{...}, ...)): queue, blocking, execute-on-capture and a trace key
// selecting one of several traces. TraceOptions add automatic keys (a trace per input
// signature), bounds on the number and bytes of traces (least recently used released first)
// and explanations: every new capture logs why at info level (last_capture_reason() returns
// it), and a warning says when captures keep happening. inputs(options, args...) gives the
// input slots of the trace such a call selects, to pass back at no cost.
//
// Thread safety: a wrapper may be called from several threads; its calls are serialised. The
// outputs of a traced call are the trace's outputs (see Tracer): they are overwritten by that
// trace's next replay and stay valid until the trace is released (by release_*, the bounds, or
// the owner's destruction).
#pragma once

#include "retrace/signature.hpp"
#include "retrace/tracer.hpp"

#include <deque>
#include <span>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace retrace {

// Base class of objects whose traces are their own: the object of a traced method, and an
// object bound by identity to a traced function (a manager, a communicator). Its traces are
// released when it is destroyed, and it has a process-unique identity (trace_owner_id()), never
// reused, so a new object built where a destroyed one lived never gets its traces. A copy is a
// new object without traces; assigning to an object releases its traces and gives it a new
// identity (the traces may have baked in the state it had).
class TraceOwner {
 public:
  TraceOwner() noexcept;
  TraceOwner(const TraceOwner&) noexcept;
  TraceOwner& operator=(const TraceOwner&) noexcept;
  ~TraceOwner();

  [[nodiscard]] std::uint64_t trace_owner_id() const noexcept { return id_; }

  // Called by wrappers when they capture a trace for this object.
  void on_destroy(std::weak_ptr<void> cache, std::function<void(std::uint64_t)> release);

 private:
  void release_traces() noexcept;

  std::uint64_t id_;
  std::mutex mutex_;
  std::vector<std::pair<std::weak_ptr<void>, std::function<void(std::uint64_t)>>> releases_;
};

namespace detail {

// Which trace a call selects. Identities, never addresses alone: the object's and bound
// owners' trace_owner_id(), the device's uid(); addresses only of objects that cannot be
// destroyed while the trace lives (held through a std::shared_ptr by the trace, or functions).
struct CacheKey {
  std::uint64_t owner = 0;   // the method's object (trace_owner_id), 0 for functions
  std::uint64_t device = 0;  // Device::uid()
  std::vector<std::uint64_t> bound_owners;
  std::vector<std::uintptr_t> bound_addresses;
  TraceKey key;
  std::optional<InputSignature> signature;
  bool operator==(const CacheKey&) const = default;
  [[nodiscard]] bool involves(std::uint64_t owner_id) const noexcept;
};
struct CacheKeyHash {
  std::size_t operator()(const CacheKey& key) const noexcept;
};

// The bounds on a set of traces (TraceOptions::max_traces, max_trace_bytes): which to release,
// least recently used first, never the newest. The one implementation of the eviction order,
// for the C++ wrappers (TraceCache) and the Python decorator.
class TraceBounds {
 public:
  TraceBounds(std::size_t max_traces, std::size_t max_trace_bytes) noexcept
      : max_traces_(max_traces), max_trace_bytes_(max_trace_bytes) {}
  struct Entry {
    std::uint64_t last_used;  // a stamp from touch()
    std::size_t bytes;        // its trace memory
  };
  // A stamp later than every earlier one, for an entry used now.
  [[nodiscard]] std::uint64_t touch() noexcept { return ++clock_; }
  // The entries to release, in order (least recently used first), so that the others stay
  // within the bounds; never `newest` (an index into entries).
  [[nodiscard]] std::vector<std::size_t> victims(std::span<const Entry> entries,
                                                 std::size_t newest) const;
  [[nodiscard]] std::size_t max_traces() const noexcept { return max_traces_; }
  [[nodiscard]] std::size_t max_trace_bytes() const noexcept { return max_trace_bytes_; }

 private:
  std::size_t max_traces_;
  std::size_t max_trace_bytes_;
  std::uint64_t clock_ = 0;
};

// The non-template part of a trace cache: bookkeeping, explanations, warnings.
class CacheBook {
 public:
  explicit CacheBook(TraceOptions options) : options_(std::move(options)) {}
  [[nodiscard]] const TraceOptions& options() const noexcept { return options_; }
  // The options a wrapper's Tracer gets: its own (one trace each); the key chose it already.
  [[nodiscard]] TraceOptions tracer_options() const {
    TraceOptions single;
    single.prep_run = options_.prep_run;
    single.clone_prep_inputs = options_.clone_prep_inputs;
    single.name = options_.name;
    return single;
  }
  [[nodiscard]] static CallOptions tracer_call(const CallOptions& call) noexcept {
    return CallOptions{call.queue, call.blocking, call.execute_on_capture, {}};
  }
  // Why a capture happens, given the keys of the live traces.
  [[nodiscard]] std::string explain(const CacheKey& key, const std::vector<const CacheKey*>& live,
                                    const std::function<std::string(std::size_t)>& path_of) const;
  void note_call(bool captured);
  TraceStats stats;
  std::string last_reason;

 private:
  TraceOptions options_;
  std::deque<bool> recent_;
  std::size_t calls_since_warning_ = 0;
};

template <class TracerT>
class TraceCache : public std::enable_shared_from_this<TraceCache<TracerT>> {
 public:
  using Outputs = typename TracerT::Outputs;

  explicit TraceCache(TraceOptions options)
      : book_(options), bounds_(options.max_traces, options.max_trace_bytes) {}

  // `owners`: the TraceOwners the key involves (their traces die with them).
  template <class MakeTracer, class PathOf, class... Ts>
  const Outputs& call(CacheKey key, const CallOptions& call, std::span<TraceOwner* const> owners,
                      MakeTracer&& make_tracer, PathOf&& path_of, const Ts&... tree_args) {
    std::lock_guard lock(mutex_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      it->second.last_used = bounds_.touch();
      const Outputs& outputs = it->second.tracer->call(CacheBook::tracer_call(call), tree_args...);
      ++book_.stats.replays;
      note_copies(*it->second.tracer);
      book_.note_call(false);
      return outputs;
    }
    // Traces of closed devices can never be selected again (keys hold device uids).
    std::erase_if(entries_, [](const auto& item) { return !item.second.tracer->devices_open(); });
    std::vector<const CacheKey*> live;
    for (const auto& [k, entry] : entries_) live.push_back(&k);
    book_.last_reason = book_.explain(key, live, path_of);
    log(LogLevel::info, "{}: capturing a new trace: {}", book_.options().name, book_.last_reason);
    std::unique_ptr<TracerT> tracer = make_tracer();
    (void)tracer->call(CacheBook::tracer_call(call), tree_args...);
    const std::size_t bytes = tracer->trace_bytes();
    auto [it, inserted] =
        entries_.emplace(std::move(key), Entry{std::move(tracer), bounds_.touch(), bytes});
    for (TraceOwner* owner : owners) {
      if (owner != nullptr && owners_.insert(owner->trace_owner_id()).second) register_owner(*owner);
    }
    ++book_.stats.captures;
    note_copies(*it->second.tracer);
    book_.note_call(true);
    enforce_bounds(it->first);
    return it->second.tracer->outputs();
  }

  // The tracer a call with this key would use (null if none yet).
  [[nodiscard]] const TracerT* find_for(const CacheKey& key) const { return find(key); }

  void release_all() {
    std::lock_guard lock(mutex_);
    entries_.clear();
  }
  // Every trace with this key (in every context).
  void release_key(const TraceKey& key) {
    erase_if([&](const CacheKey& k) { return k.key == key; });
  }
  // Every trace that involves the owner (as the method's object or a bound argument).
  void release_owner(std::uint64_t owner) {
    erase_if([&](const CacheKey& k) { return k.involves(owner); });
    std::lock_guard lock(mutex_);
    owners_.erase(owner);
  }
  void release_owner_key(std::uint64_t owner, const TraceKey& key) {
    erase_if([&](const CacheKey& k) { return k.owner == owner && k.key == key; });
  }
  [[nodiscard]] TraceStats stats() const {
    std::lock_guard lock(mutex_);
    TraceStats s = book_.stats;
    s.live_traces = entries_.size();
    for (const auto& [k, entry] : entries_) s.trace_bytes += entry.bytes;
    return s;
  }
  // The tracer of a key, or null.
  [[nodiscard]] const TracerT* find(const CacheKey& key) const {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : it->second.tracer.get();
  }
  [[nodiscard]] std::size_t live_traces(std::uint64_t owner) const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [k, entry] : entries_) n += k.owner == owner ? 1 : 0;
    return n;
  }
  [[nodiscard]] const TraceOptions& options() const noexcept { return book_.options(); }
  [[nodiscard]] std::string last_capture_reason() const {
    std::lock_guard lock(mutex_);
    return book_.last_reason;
  }

 private:
  struct Entry {
    std::unique_ptr<TracerT> tracer;
    std::uint64_t last_used;
    std::size_t bytes;
  };

  void note_copies(const TracerT& tracer) {
    const TraceStats last = tracer.stats();
    book_.stats.bytes_refreshed = last.bytes_refreshed;
    book_.stats.copies = last.copies;
    book_.stats.copies_skipped = last.copies_skipped;
  }

  template <class Pred>
  void erase_if(Pred pred) {
    std::lock_guard lock(mutex_);
    std::erase_if(entries_, [&](const auto& item) { return pred(item.first); });
  }

  void register_owner(TraceOwner& owner) {
    std::weak_ptr<TraceCache> weak = this->weak_from_this();
    owner.on_destroy(weak, [weak](std::uint64_t dying) {
      if (auto cache = weak.lock()) cache->release_owner(dying);
    });
  }

  // Releases least recently used traces (never the newest) while a bound is exceeded.
  void enforce_bounds(const CacheKey& newest) {
    std::vector<typename decltype(entries_)::iterator> order;
    std::vector<TraceBounds::Entry> entries;
    std::size_t newest_index = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == newest) newest_index = order.size();
      order.push_back(it);
      entries.push_back({it->second.last_used, it->second.bytes});
    }
    const TraceOptions& o = book_.options();
    for (std::size_t victim : bounds_.victims(entries, newest_index)) {
      log(LogLevel::info,
          "{}: released the least recently used trace (key {}, {} bytes) to stay within "
          "max_traces={} and max_trace_bytes={}",
          o.name, order[victim]->first.key.to_string(), order[victim]->second.bytes,
          o.max_traces, o.max_trace_bytes);
      entries_.erase(order[victim]);
      ++book_.stats.evictions;
    }
  }

  mutable std::recursive_mutex mutex_;
  CacheBook book_;
  std::unordered_map<CacheKey, Entry, CacheKeyHash> entries_;
  std::unordered_set<std::uint64_t> owners_;  // owners whose destruction we hear of
  TraceBounds bounds_;
};

// --- parameter classification for modes 2 and 3 ------------------------------------------------

enum class ParamKind : std::uint8_t { device, tree, bound };

template <class P>
constexpr ParamKind param_kind() {
  if constexpr (std::is_same_v<std::remove_cvref_t<P>, Device>) {
    return ParamKind::device;
  } else if constexpr (is_tree_v<P>) {
    return ParamKind::tree;
  } else {
    return ParamKind::bound;
  }
}

template <class... P>
struct ParamList {
  static constexpr std::size_t size = sizeof...(P);
  static constexpr std::array<ParamKind, sizeof...(P)> kinds{param_kind<P>()...};
  static constexpr std::size_t count(ParamKind kind) {
    std::size_t n = 0;
    for (ParamKind k : kinds) n += k == kind ? 1 : 0;
    return n;
  }
  // Position of parameter I among the parameters of its kind.
  template <std::size_t I>
  static constexpr std::size_t rank() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < I; ++i) n += kinds[i] == kinds[I] ? 1 : 0;
    return n;
  }
  template <ParamKind K, std::size_t R>
  static constexpr std::size_t index_of() {
    std::size_t seen = 0;
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      if (kinds[i] == K && seen++ == R) return i;
    }
    return kinds.size();
  }
};

// How a bound (non-tree) parameter is held and identified:
//  owner:    T& or T* with T derived from TraceOwner: its trace_owner_id(); traces die with it.
//  shared:   std::shared_ptr<T>: its address; the trace holds a copy, so it cannot die first.
//  function: a function pointer: its address (functions are never destroyed).
enum class BoundKind : std::uint8_t { owner, shared, function, invalid };

template <class T>
struct IsSharedPtr : std::false_type {};
template <class T>
struct IsSharedPtr<std::shared_ptr<T>> : std::true_type {};

template <class P>
constexpr BoundKind bound_kind() {
  using U = std::remove_cvref_t<P>;
  if constexpr (IsSharedPtr<U>::value) {
    return BoundKind::shared;
  } else if constexpr (std::is_pointer_v<U> && std::is_function_v<std::remove_pointer_t<U>>) {
    return BoundKind::function;
  } else if constexpr (std::is_pointer_v<U>) {
    return std::is_base_of_v<TraceOwner, std::remove_cv_t<std::remove_pointer_t<U>>>
               ? BoundKind::owner
               : BoundKind::invalid;
  } else if constexpr (std::is_lvalue_reference_v<P>) {
    return std::is_base_of_v<TraceOwner, U> ? BoundKind::owner : BoundKind::invalid;
  } else {
    return BoundKind::invalid;
  }
}

template <class P>
constexpr bool valid_bound_param() {
  return bound_kind<P>() != BoundKind::invalid;
}

// owner references are held as pointers; the rest by value.
template <class P>
using BoundStorage =
    std::conditional_t<bound_kind<P>() == BoundKind::owner && std::is_lvalue_reference_v<P>,
                       std::remove_reference_t<P>*, std::remove_cvref_t<P>>;

template <class Sig>
struct FunctionTraits;
template <class R, class... P>
struct FunctionTraits<R (*)(P...)> {
  using Result = R;
  using Params = ParamList<P...>;
  using ParamTuple = std::tuple<P...>;
};
template <class R, class C, class... P>
struct FunctionTraits<R (C::*)(P...) const> : FunctionTraits<R (*)(P...)> {};
template <class R, class C, class... P>
struct FunctionTraits<R (C::*)(P...)> : FunctionTraits<R (*)(P...)> {};
template <class Fn>
struct CallableTraits : FunctionTraits<decltype(&Fn::operator())> {};
template <class R, class... P>
struct CallableTraits<R (*)(P...)> : FunctionTraits<R (*)(P...)> {};

}  // namespace detail

// --- mode 1: context-bound methods -------------------------------------------------------------

template <class Obj, class Method, class R, class... A>
class TracedMethod {
  static_assert(std::is_base_of_v<TraceOwner, Obj>,
                "retrace::traced_method: the class must derive from retrace::TraceOwner, so "
                "that its traces are released when an object is destroyed");
  static_assert((is_tree_v<A> && ...),
                "retrace::traced_method: every method parameter must be a tree type (Tensor, "
                "scalars, strings, containers, RETRACE_FIELDS structs)");

  struct Invoker {
    Method method;
    Obj* object;
    R operator()(std::remove_cvref_t<A>&... args) const {
      return std::invoke(method, *object, args...);
    }
  };
  using TracerT = Tracer<Invoker, std::remove_cvref_t<A>...>;

 public:
  using Outputs = typename TracerT::Outputs;

  TracedMethod(Method method, std::function<Device&(Obj&)> device_of, TraceOptions options)
      : method_(method),
        device_of_(std::move(device_of)),
        cache_(std::make_shared<detail::TraceCache<TracerT>>(std::move(options))) {}

  // A traced call with default options: the object's trace for the default key.
  const Outputs& operator()(Obj& object, const std::remove_cvref_t<A>&... args) {
    return call(CallOptions{}, object, args...);
  }
  const Outputs& call(const CallOptions& options, Obj& object,
                      const std::remove_cvref_t<A>&... args) {
    Device& device = device_of_(object);
    device.link()->require_open(cache_->options().name);
    detail::CacheKey key = key_of(object, device, options.key);
    if (cache_->options().auto_key) key.signature = make_signature(&device, {}, args...);
    auto make = [&] {
      return std::make_unique<TracerT>(Invoker{method_, &object}, device,
                                       detail::CacheBook{cache_->options()}.tracer_options());
    };
    auto path_of = [&](std::size_t leaf) { return leaf_path(leaf, {}, args...); };
    TraceOwner* const owners[] = {&object};
    return cache_->call(std::move(key), options, owners, make, path_of, args...);
  }
  // The plain method call, no trace.
  R untraced(Obj& object, const std::remove_cvref_t<A>&... args) const {
    return std::invoke(method_, object, args...);
  }

  // The input slots of the trace a call with these options and arguments selects (pass them
  // back: no copy); failed_precondition if that call has not captured yet.
  [[nodiscard]] const typename TracerT::Inputs& inputs(const CallOptions& options, Obj& object,
                                                       const std::remove_cvref_t<A>&... args) const {
    return require(tracer(options, object, args...), object).inputs();
  }
  // The same for the object's trace with `key` (not with automatic keys, which need the args).
  [[nodiscard]] const typename TracerT::Inputs& inputs(Obj& object, const TraceKey& key = {}) const {
    return require(tracer(object, key), object).inputs();
  }
  // The tracer behind that trace (null if none), e.g. to inspect its trace.
  [[nodiscard]] const TracerT* tracer(const CallOptions& options, Obj& object,
                                      const std::remove_cvref_t<A>&... args) const {
    Device& device = device_of_(object);
    detail::CacheKey key = key_of(object, device, options.key);
    if (cache_->options().auto_key) key.signature = make_signature(&device, {}, args...);
    return cache_->find(key);
  }
  [[nodiscard]] const TracerT* tracer(Obj& object, const TraceKey& key = {}) const {
    return cache_->find(key_of(object, device_of_(object), key));
  }

  void release(Obj& object) { cache_->release_owner(object.trace_owner_id()); }
  void release(Obj& object, const TraceKey& key) {
    cache_->release_owner_key(object.trace_owner_id(), key);
  }
  void release_key(const TraceKey& key) { cache_->release_key(key); }
  void release_all() { cache_->release_all(); }
  [[nodiscard]] std::size_t live_traces(const Obj& object) const {
    return cache_->live_traces(object.trace_owner_id());
  }
  [[nodiscard]] TraceStats stats() const { return cache_->stats(); }
  // Why the last capture happened ("new trace key 256", "new input signature: ...").
  [[nodiscard]] std::string last_capture_reason() const { return cache_->last_capture_reason(); }

 private:
  static detail::CacheKey key_of(const Obj& object, const Device& device, const TraceKey& key) {
    detail::CacheKey k;
    k.owner = object.trace_owner_id();
    k.device = device.uid();
    k.key = key;
    return k;
  }
  const TracerT& require(const TracerT* found, const Obj& object) const {
    RETRACE_CHECK(found != nullptr, failed_precondition,
                  "{}: no trace for object #{} with this key; make a traced call first",
                  cache_->options().name, object.trace_owner_id());
    return *found;
  }

  Method method_;
  std::function<Device&(Obj&)> device_of_;
  std::shared_ptr<detail::TraceCache<TracerT>> cache_;
};

template <class Obj, class R, class... A, class DeviceOf>
[[nodiscard]] auto traced_method(R (Obj::*method)(A...), DeviceOf device_of,
                                 TraceOptions options = {}) {
  return TracedMethod<Obj, R (Obj::*)(A...), R, A...>(method, std::move(device_of),
                                                      std::move(options));
}
template <class Obj, class R, class... A, class DeviceOf>
[[nodiscard]] auto traced_method(R (Obj::*method)(A...) const, DeviceOf device_of,
                                 TraceOptions options = {}) {
  return TracedMethod<Obj, R (Obj::*)(A...) const, R, A...>(method, std::move(device_of),
                                                            std::move(options));
}

// --- modes 2 and 3: device parameter, injected device ------------------------------------------

template <class Fn, bool Injected, class R, class... P>
class TracedFunction {
  using Params = detail::ParamList<P...>;
  static constexpr std::size_t kDevices = Params::count(detail::ParamKind::device);
  static_assert(Injected || kDevices == 1,
                "retrace::traced_function: the function needs exactly one Device& parameter (the "
                "device is found by its type); for a function without one, use "
                "traced_function_injected");
  static_assert(!Injected || kDevices == 0,
                "retrace::traced_function_injected: the function already takes a Device& "
                "parameter, so the device would be given twice; use traced_function instead");
  static_assert((... && (detail::param_kind<P>() != detail::ParamKind::bound ||
                         detail::valid_bound_param<P>())),
                "retrace::traced_function: a parameter that is not a tree (a manager, a callback, "
                "a config without RETRACE_FIELDS) is bound by identity, and identity must "
                "outlive the trace: take it as a reference or pointer to a class derived from "
                "retrace::TraceOwner (its traces die with it), as a std::shared_ptr (the trace "
                "keeps it alive), or as a function pointer");
  static_assert((... && (detail::param_kind<P>() != detail::ParamKind::device ||
                         std::is_lvalue_reference_v<P>)),
                "retrace::traced_function: take the device as Device&");

  template <detail::ParamKind K>
  static constexpr auto kinds_sequence() {
    return []<std::size_t... R2>(std::index_sequence<R2...>) {
      return std::index_sequence<Params::template index_of<K, R2>()...>{};
    }(std::make_index_sequence<Params::count(K)>{});
  }
  template <class Seq>
  struct TreeTracer;
  template <std::size_t... I>
  struct TreeTracer<std::index_sequence<I...>> {
    using BoundTuple = decltype([]<std::size_t... B>(std::index_sequence<B...>) {
      return std::tuple<detail::BoundStorage<std::tuple_element_t<B, std::tuple<P...>>>...>{};
    }(kinds_sequence<detail::ParamKind::bound>()));

    struct Invoker {
      const Fn* function;
      Device* device;
      BoundTuple bound;
      R operator()(std::remove_cvref_t<std::tuple_element_t<I, std::tuple<P...>>>&... tree) const {
        auto trees = std::forward_as_tuple(tree...);
        return [&]<std::size_t... J>(std::index_sequence<J...>) -> R {
          return std::invoke(*function, argument<J>(trees)...);
        }(std::index_sequence_for<P...>{});
      }
      template <std::size_t J, class Trees>
      decltype(auto) argument(Trees& trees) const {
        constexpr detail::ParamKind kind = Params::kinds[J];
        if constexpr (kind == detail::ParamKind::device) {
          return (*device);
        } else if constexpr (kind == detail::ParamKind::tree) {
          return std::get<Params::template rank<J>()>(trees);
        } else if constexpr (std::is_reference_v<std::tuple_element_t<J, std::tuple<P...>>> &&
                             detail::bound_kind<std::tuple_element_t<J, std::tuple<P...>>>() ==
                                 detail::BoundKind::owner) {
          return (*std::get<Params::template rank<J>()>(bound));
        } else {
          return (std::get<Params::template rank<J>()>(bound));
        }
      }
    };
    using type = Tracer<Invoker, std::remove_cvref_t<std::tuple_element_t<I, std::tuple<P...>>>...>;
  };
  using TreeIndices = decltype(kinds_sequence<detail::ParamKind::tree>());
  using TracerT = typename TreeTracer<TreeIndices>::type;
  using Invoker = typename TreeTracer<TreeIndices>::Invoker;
  using BoundTuple = typename TreeTracer<TreeIndices>::BoundTuple;

 public:
  using Outputs = typename TracerT::Outputs;

  TracedFunction(Fn function, TraceOptions options)
      : function_(std::make_unique<Fn>(std::move(function))),
        cache_(std::make_shared<detail::TraceCache<TracerT>>(std::move(options))) {}

  // A traced call with default options. Mode 2: the function's own arguments, device included.
  // Mode 3: the device, then the function's arguments.
  template <class... Ts>
  const Outputs& operator()(Ts&&... args) {
    return call(CallOptions{}, std::forward<Ts>(args)...);
  }
  template <class... Ts>
  const Outputs& call(const CallOptions& options, Ts&&... args) {
    return with_device(
        [&](Device& device, auto& all) -> const Outputs& { return dispatch(options, device, all); },
        args...);
  }
  // The plain function call (mode 3: without the device), no trace.
  template <class... Ts>
  R untraced(Ts&&... args) const {
    return std::invoke(*function_, std::forward<Ts>(args)...);
  }

  // The input slots of the trace a call with these options and arguments selects (pass them
  // back: no copy); failed_precondition if that call has not captured yet.
  template <class... Ts>
  [[nodiscard]] const typename TracerT::Inputs& inputs(const CallOptions& options,
                                                       Ts&&... args) const {
    const TracerT* found = tracer(options, std::forward<Ts>(args)...);
    RETRACE_CHECK(found != nullptr, failed_precondition,
                  "{}: no trace for these arguments and key {}; make a traced call first",
                  cache_->options().name, options.key.to_string());
    return found->inputs();
  }
  // The tracer behind that trace (null if none), e.g. to inspect its trace.
  template <class... Ts>
  [[nodiscard]] const TracerT* tracer(const CallOptions& options, Ts&&... args) const {
    return with_device(
        [&](Device& device, auto& all) -> const TracerT* {
          std::vector<TraceOwner*> owners;
          BoundTuple bound = bound_of(all, kinds_sequence<detail::ParamKind::bound>());
          return cache_->find(key_for(options, device, all, bound, owners));
        },
        args...);
  }

  void release_key(const TraceKey& key) { cache_->release_key(key); }
  void release_all() { cache_->release_all(); }
  [[nodiscard]] TraceStats stats() const { return cache_->stats(); }
  // Why the last capture happened ("first traced call", "new trace key 256", ...).
  [[nodiscard]] std::string last_capture_reason() const { return cache_->last_capture_reason(); }

 private:
  // Calls f(device, arguments) with the function's arguments as a tuple of references.
  template <class F, class... Ts>
  static decltype(auto) with_device(F&& f, Ts&... args) {
    if constexpr (Injected) {
      return inject(f, args...);
    } else {
      static_assert(sizeof...(Ts) == sizeof...(P),
                    "retrace::traced_function: a traced call takes the function's arguments");
      auto all = std::forward_as_tuple(args...);
      Device& device = std::get<Params::template index_of<detail::ParamKind::device, 0>()>(all);
      return f(device, all);
    }
  }
  template <class F, class D, class... Ts>
  static decltype(auto) inject(F& f, D& device, Ts&... args) {
    static_assert(std::is_same_v<std::remove_cvref_t<D>, Device>,
                  "retrace::traced_function_injected: a traced call takes the device first");
    static_assert(sizeof...(Ts) == sizeof...(P),
                  "retrace::traced_function_injected: a traced call takes the device, then the "
                  "function's arguments (the device only once)");
    auto all = std::forward_as_tuple(args...);
    return f(static_cast<Device&>(device), all);
  }

  // The key a call selects: the device's uid, the bound arguments' identities, the user's key,
  // and with automatic keys the input signature.
  template <class All>
  detail::CacheKey key_for(const CallOptions& options, Device& device, All& all,
                           const BoundTuple& bound, std::vector<TraceOwner*>& owners) const {
    detail::CacheKey key;
    key.device = device.uid();
    key.key = options.key;
    std::apply([&](const auto&... held) { (identify(held, key, owners), ...); }, bound);
    if (cache_->options().auto_key) {
      [&]<std::size_t... T>(std::index_sequence<T...>) {
        static constexpr std::array<std::size_t, sizeof...(T)> positions{T...};
        key.signature = make_signature(&device, positions, std::get<T>(all)...);
      }(kinds_sequence<detail::ParamKind::tree>());
    }
    return key;
  }

  template <class All>
  const Outputs& dispatch(const CallOptions& options, Device& device, All& all) {
    device.link()->require_open(cache_->options().name);
    BoundTuple bound = bound_of(all, kinds_sequence<detail::ParamKind::bound>());
    std::vector<TraceOwner*> owners;
    detail::CacheKey key = key_for(options, device, all, bound, owners);
    return [&]<std::size_t... T>(std::index_sequence<T...>) -> const Outputs& {
      static constexpr std::array<std::size_t, sizeof...(T)> positions{T...};
      auto make = [&] {
        auto tracer = std::make_unique<TracerT>(Invoker{function_.get(), &device, bound}, device,
                                                detail::CacheBook{cache_->options()}.tracer_options());
        tracer->set_argument_positions(std::vector<std::size_t>(positions.begin(), positions.end()));
        return tracer;
      };
      auto path_of = [&](std::size_t leaf) {
        return leaf_path(leaf, positions, std::get<T>(all)...);
      };
      return cache_->call(std::move(key), options, owners, make, path_of, std::get<T>(all)...);
    }(kinds_sequence<detail::ParamKind::tree>());
  }

  template <class All, std::size_t... B>
  static BoundTuple bound_of(All& all, std::index_sequence<B...>) {
    return BoundTuple{hold<std::tuple_element_t<B, std::tuple<P...>>>(std::get<B>(all))...};
  }
  // What the tracer keeps of a bound argument: a pointer to an owner, or the value itself.
  template <class Param, class T>
  static detail::BoundStorage<Param> hold(T& value) {
    if constexpr (std::is_lvalue_reference_v<Param> &&
                  detail::bound_kind<Param>() == detail::BoundKind::owner) {
      return &value;
    } else {
      return value;
    }
  }
  // Adds a bound argument's identity to the key (see CacheKey).
  template <class Held>
  static void identify(const Held& held, detail::CacheKey& key, std::vector<TraceOwner*>& owners) {
    if constexpr (detail::IsSharedPtr<Held>::value) {
      key.bound_addresses.push_back(reinterpret_cast<std::uintptr_t>(held.get()));
    } else if constexpr (std::is_function_v<std::remove_pointer_t<Held>>) {
      key.bound_addresses.push_back(reinterpret_cast<std::uintptr_t>(held));
    } else {
      auto* owner = const_cast<TraceOwner*>(static_cast<const TraceOwner*>(held));
      key.bound_owners.push_back(owner != nullptr ? owner->trace_owner_id() : 0);
      owners.push_back(owner);
    }
  }

  std::unique_ptr<Fn> function_;  // stable address: tracers call it through a pointer
  std::shared_ptr<detail::TraceCache<TracerT>> cache_;
};

namespace detail {
template <bool Injected, class Fn, class Tuple>
struct TracedFunctionFor;
template <bool Injected, class Fn, class... P>
struct TracedFunctionFor<Injected, Fn, std::tuple<P...>> {
  using type =
      TracedFunction<Fn, Injected, typename CallableTraits<Fn>::Result, P...>;
};
}  // namespace detail

template <class Fn>
[[nodiscard]] auto traced_function(Fn function, TraceOptions options = {}) {
  using T = typename detail::TracedFunctionFor<false, Fn,
                                               typename detail::CallableTraits<Fn>::ParamTuple>::type;
  return T(std::move(function), std::move(options));
}

template <class Fn>
[[nodiscard]] auto traced_function_injected(Fn function, TraceOptions options = {}) {
  using T = typename detail::TracedFunctionFor<true, Fn,
                                               typename detail::CallableTraits<Fn>::ParamTuple>::type;
  return T(std::move(function), std::move(options));
}

}  // namespace retrace
