// Traced functions and methods: wrappers that can be called untraced (a plain call, no
// overhead) or traced (capture on the first call, replay afterwards), with several traces per
// wrapper selected by a key.
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
//       step(pipeline, x, 0.5f);          // untraced
//       step.traced(pipeline, x, 0.5f);   // traced
//
//  2. A device parameter. A free function takes a `Device&` (found by its type). Parameters that
//     are not trees (a manager, a callback, a config struct without RETRACE_FIELDS) must be
//     references or pointers: they are bound, and the trace is chosen by their identity and the
//     device's:
//
//       Tensor attention(const Tensor& x, Device& device, const CclManager& ccl);
//       auto traced_attention = retrace::traced_function(attention);
//       traced_attention.traced(x, device, ccl);
//
//  3. An injected device. The function takes no device; the wrapper is given one per traced
//     call as the first argument:
//
//       auto traced_gelu = retrace::traced_function_injected(gelu);
//       traced_gelu.traced(device, x);
//
// Per call (traced_with(TraceCall{...}, ...)): queue, blocking, execute-on-capture and a trace
// key ("1024x1024") selecting one of several traces. TracedOptions add automatic keys (a trace
// per input signature), bounds on the number and bytes of traces (least recently used released
// first) and explanations: every new capture logs why at info level, and a warning says when
// captures keep happening.
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

struct TraceCall {
  QueueId queue = kDefaultQueue;
  Blocking blocking = Blocking::yes;
  bool execute_on_capture = true;
  std::string key{};  // selects one of several traces; "" is the default trace
};

struct TracedOptions {
  bool prep_run = true;
  bool clone_prep_inputs = true;
  // Key traces by the input signature (shapes, dtypes, layouts, devices, scalar values): a new
  // shape captures a new trace instead of failing the shape check.
  bool auto_key = false;
  std::size_t max_traces = 0;       // 0: unbounded
  std::size_t max_trace_bytes = 0;  // 0: unbounded
  std::string name = "traced function";
};

struct TracedStats {
  std::size_t live_traces = 0;
  std::size_t trace_bytes = 0;
  std::uint64_t captures = 0;
  std::uint64_t replays = 0;
  std::uint64_t evictions = 0;
};

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
  std::string key;
  std::optional<InputSignature> signature;
  bool operator==(const CacheKey&) const = default;
  [[nodiscard]] bool involves(std::uint64_t owner_id) const noexcept;
};
struct CacheKeyHash {
  std::size_t operator()(const CacheKey& key) const noexcept;
};

// The non-template part of a trace cache: bookkeeping, explanations, warnings.
class CacheBook {
 public:
  explicit CacheBook(TracedOptions options) : options_(std::move(options)) {}
  [[nodiscard]] const TracedOptions& options() const noexcept { return options_; }
  [[nodiscard]] CallOptions call_options(const TraceCall& call) const noexcept {
    return CallOptions{call.queue, call.blocking, call.execute_on_capture};
  }
  // Why a capture happens, given the keys of the live traces.
  [[nodiscard]] std::string explain(const CacheKey& key, const std::vector<const CacheKey*>& live,
                                    const std::function<std::string(std::size_t)>& path_of) const;
  void note_call(bool captured);
  TracedStats stats;

 private:
  TracedOptions options_;
  std::deque<bool> recent_;
  std::size_t calls_since_warning_ = 0;
};

template <class TracerT>
class TraceCache : public std::enable_shared_from_this<TraceCache<TracerT>> {
 public:
  using Outputs = typename TracerT::Outputs;

  explicit TraceCache(TracedOptions options) : book_(std::move(options)) {}

  // `owners`: the TraceOwners the key involves (their traces die with them).
  template <class MakeTracer, class PathOf, class... Ts>
  const Outputs& call(CacheKey key, const TraceCall& call, std::span<TraceOwner* const> owners,
                      MakeTracer&& make_tracer, PathOf&& path_of, const Ts&... tree_args) {
    std::lock_guard lock(mutex_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      it->second.last_used = ++clock_;
      const Outputs& outputs = it->second.tracer->call(book_.call_options(call), tree_args...);
      ++book_.stats.replays;
      book_.note_call(false);
      return outputs;
    }
    // Traces of closed devices can never be selected again (keys hold device uids).
    std::erase_if(entries_, [](const auto& item) { return !item.second.tracer->devices_open(); });
    std::vector<const CacheKey*> live;
    for (const auto& [k, entry] : entries_) live.push_back(&k);
    const std::string why = book_.explain(key, live, path_of);
    log(LogLevel::info, "{}: capturing a new trace: {}", book_.options().name, why);
    std::unique_ptr<TracerT> tracer = make_tracer();
    (void)tracer->call(book_.call_options(call), tree_args...);
    const std::size_t bytes = tracer->trace_bytes();
    auto [it, inserted] = entries_.emplace(std::move(key), Entry{std::move(tracer), ++clock_, bytes});
    for (TraceOwner* owner : owners) {
      if (owner != nullptr && owners_.insert(owner->trace_owner_id()).second) register_owner(*owner);
    }
    ++book_.stats.captures;
    book_.note_call(true);
    enforce_bounds(it->first);
    return it->second.tracer->outputs();
  }

  void release_all() {
    std::lock_guard lock(mutex_);
    entries_.clear();
  }
  // Every trace with this key (in every context).
  void release_key(const std::string& key) {
    erase_if([&](const CacheKey& k) { return k.key == key; });
  }
  // Every trace that involves the owner (as the method's object or a bound argument).
  void release_owner(std::uint64_t owner) {
    erase_if([&](const CacheKey& k) { return k.involves(owner); });
    std::lock_guard lock(mutex_);
    owners_.erase(owner);
  }
  void release_owner_key(std::uint64_t owner, const std::string& key) {
    erase_if([&](const CacheKey& k) { return k.owner == owner && k.key == key; });
  }
  [[nodiscard]] TracedStats stats() const {
    std::lock_guard lock(mutex_);
    TracedStats s = book_.stats;
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
  [[nodiscard]] const TracedOptions& options() const noexcept { return book_.options(); }

 private:
  struct Entry {
    std::unique_ptr<TracerT> tracer;
    std::uint64_t last_used;
    std::size_t bytes;
  };

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
    const TracedOptions& o = book_.options();
    auto total_bytes = [&] {
      std::size_t b = 0;
      for (const auto& [k, e] : entries_) b += e.bytes;
      return b;
    };
    while ((o.max_traces != 0 && entries_.size() > o.max_traces) ||
           (o.max_trace_bytes != 0 && total_bytes() > o.max_trace_bytes && entries_.size() > 1)) {
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->first == newest) continue;
        if (victim == entries_.end() || it->second.last_used < victim->second.last_used) victim = it;
      }
      if (victim == entries_.end()) break;
      log(LogLevel::info,
          "{}: released the least recently used trace (key \"{}\", {} bytes) to stay within "
          "max_traces={} and max_trace_bytes={}",
          o.name, victim->first.key, victim->second.bytes, o.max_traces, o.max_trace_bytes);
      entries_.erase(victim);
      ++book_.stats.evictions;
    }
  }

  mutable std::recursive_mutex mutex_;
  CacheBook book_;
  std::unordered_map<CacheKey, Entry, CacheKeyHash> entries_;
  std::unordered_set<std::uint64_t> owners_;  // owners whose destruction we hear of
  std::uint64_t clock_ = 0;
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
    R operator()(const std::remove_cvref_t<A>&... args) const {
      return std::invoke(method, *object, args...);
    }
  };
  using TracerT = Tracer<Invoker, std::remove_cvref_t<A>...>;

 public:
  using Outputs = typename TracerT::Outputs;

  TracedMethod(Method method, std::function<Device&(Obj&)> device_of, TracedOptions options)
      : method_(method),
        device_of_(std::move(device_of)),
        cache_(std::make_shared<detail::TraceCache<TracerT>>(std::move(options))) {}

  // Untraced: exactly the method call.
  R operator()(Obj& object, const std::remove_cvref_t<A>&... args) const {
    return std::invoke(method_, object, args...);
  }
  const Outputs& traced(Obj& object, const std::remove_cvref_t<A>&... args) {
    return traced_with(TraceCall{}, object, args...);
  }
  const Outputs& traced_with(const TraceCall& call, Obj& object,
                             const std::remove_cvref_t<A>&... args) {
    Device& device = device_of_(object);
    device.link()->require_open(cache_->options().name);
    detail::CacheKey key = key_of(object, device, call.key);
    if (cache_->options().auto_key) key.signature = make_signature(&device, {}, args...);
    auto make = [&] {
      const TracedOptions& o = cache_->options();
      return std::make_unique<TracerT>(
          Invoker{method_, &object}, device,
          TracerOptions{o.prep_run, o.clone_prep_inputs, o.name, {}});
    };
    auto path_of = [&](std::size_t leaf) { return leaf_path(leaf, {}, args...); };
    TraceOwner* const owners[] = {&object};
    return cache_->call(std::move(key), call, owners, make, path_of, args...);
  }

  // The input slots of the object's trace for `key` (pass them back: no copy). Not available
  // with automatic keys.
  [[nodiscard]] const typename TracerT::Inputs& inputs(Obj& object,
                                                       const std::string& key = "") const {
    const TracerT* found = tracer(object, key);
    RETRACE_CHECK(found != nullptr, failed_precondition,
                  "{}: no trace for this object with key \"{}\"; make a traced call first",
                  cache_->options().name, key);
    return found->inputs();
  }
  // The tracer behind the object's trace for `key` (null if none), e.g. to inspect its trace.
  [[nodiscard]] const TracerT* tracer(Obj& object, const std::string& key = "") const {
    return cache_->find(key_of(object, device_of_(object), key));
  }

  void release(Obj& object) { cache_->release_owner(object.trace_owner_id()); }
  void release(Obj& object, const std::string& key) {
    cache_->release_owner_key(object.trace_owner_id(), key);
  }
  void release_key(const std::string& key) { cache_->release_key(key); }
  void release_all() { cache_->release_all(); }
  [[nodiscard]] std::size_t live_traces(const Obj& object) const {
    return cache_->live_traces(object.trace_owner_id());
  }
  [[nodiscard]] TracedStats stats() const { return cache_->stats(); }

 private:
  static detail::CacheKey key_of(const Obj& object, const Device& device, const std::string& key) {
    detail::CacheKey k;
    k.owner = object.trace_owner_id();
    k.device = device.uid();
    k.key = key;
    return k;
  }

  Method method_;
  std::function<Device&(Obj&)> device_of_;
  std::shared_ptr<detail::TraceCache<TracerT>> cache_;
};

template <class Obj, class R, class... A, class DeviceOf>
[[nodiscard]] auto traced_method(R (Obj::*method)(A...), DeviceOf device_of,
                                 TracedOptions options = {}) {
  return TracedMethod<Obj, R (Obj::*)(A...), R, A...>(method, std::move(device_of),
                                                      std::move(options));
}
template <class Obj, class R, class... A, class DeviceOf>
[[nodiscard]] auto traced_method(R (Obj::*method)(A...) const, DeviceOf device_of,
                                 TracedOptions options = {}) {
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
      R operator()(const std::remove_cvref_t<std::tuple_element_t<I, std::tuple<P...>>>&... tree)
          const {
        auto trees = std::forward_as_tuple(tree...);
        return [&]<std::size_t... J>(std::index_sequence<J...>) -> R {
          return std::invoke(*function, argument<J>(trees)...);
        }(std::index_sequence_for<P...>{});
      }
      template <std::size_t J, class Trees>
      decltype(auto) argument(const Trees& trees) const {
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

  TracedFunction(Fn function, TracedOptions options)
      : function_(std::make_unique<Fn>(std::move(function))),
        cache_(std::make_shared<detail::TraceCache<TracerT>>(std::move(options))) {}

  // Untraced: exactly the function call.
  template <class... Ts>
  R operator()(Ts&&... args) const {
    return std::invoke(*function_, std::forward<Ts>(args)...);
  }

  // Mode 2: traced(args...) with the function's own arguments, device included.
  // Mode 3: traced(device, args...).
  template <class... Ts>
  const Outputs& traced(Ts&&... args) {
    return traced_with(TraceCall{}, std::forward<Ts>(args)...);
  }

  template <class... Ts>
  const Outputs& traced_with(const TraceCall& call, Ts&&... args) {
    if constexpr (Injected) {
      return traced_injected(call, std::forward<Ts>(args)...);
    } else {
      static_assert(sizeof...(Ts) == sizeof...(P),
                    "retrace::traced_function: traced() takes the function's arguments");
      auto all = std::forward_as_tuple(args...);
      Device& device = std::get<Params::template index_of<detail::ParamKind::device, 0>()>(all);
      return dispatch(call, device, all);
    }
  }

  void release_key(const std::string& key) { cache_->release_key(key); }
  void release_all() { cache_->release_all(); }
  [[nodiscard]] TracedStats stats() const { return cache_->stats(); }

 private:
  template <class... Ts>
  const Outputs& traced_injected(const TraceCall& call, Device& device, Ts&&... args) {
    static_assert(sizeof...(Ts) == sizeof...(P),
                  "retrace::traced_function_injected: traced() takes the device, then the "
                  "function's arguments (the device only once)");
    auto all = std::forward_as_tuple(args...);
    return dispatch(call, device, all);
  }

  template <class All>
  const Outputs& dispatch(const TraceCall& call, Device& device, All& all) {
    device.link()->require_open(cache_->options().name);
    BoundTuple bound = bound_of(all, kinds_sequence<detail::ParamKind::bound>());
    detail::CacheKey key;
    key.device = device.uid();
    key.key = call.key;
    std::vector<TraceOwner*> owners;
    std::apply([&](const auto&... held) { (identify(held, key, owners), ...); }, bound);
    return [&]<std::size_t... T>(std::index_sequence<T...>) -> const Outputs& {
      static constexpr std::array<std::size_t, sizeof...(T)> positions{T...};
      if (cache_->options().auto_key) {
        key.signature = make_signature(&device, positions, std::get<T>(all)...);
      }
      auto make = [&] {
        const TracedOptions& o = cache_->options();
        return std::make_unique<TracerT>(
            Invoker{function_.get(), &device, bound}, device,
            TracerOptions{o.prep_run, o.clone_prep_inputs, o.name,
                          std::vector<std::size_t>(positions.begin(), positions.end())});
      };
      auto path_of = [&](std::size_t leaf) {
        return leaf_path(leaf, positions, std::get<T>(all)...);
      };
      return cache_->call(std::move(key), call, owners, make, path_of, std::get<T>(all)...);
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
[[nodiscard]] auto traced_function(Fn function, TracedOptions options = {}) {
  using T = typename detail::TracedFunctionFor<false, Fn,
                                               typename detail::CallableTraits<Fn>::ParamTuple>::type;
  return T(std::move(function), std::move(options));
}

template <class Fn>
[[nodiscard]] auto traced_function_injected(Fn function, TracedOptions options = {}) {
  using T = typename detail::TracedFunctionFor<true, Fn,
                                               typename detail::CallableTraits<Fn>::ParamTuple>::type;
  return T(std::move(function), std::move(options));
}

}  // namespace retrace
