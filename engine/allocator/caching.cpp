// A caching CPU allocator for PyTorch, bounded by a byte limit: large blocks freed by one step are handed
// out again to the next request of the same size instead of being unmapped and faulted back in.
//
// Large requests (at least `threshold` bytes) are rounded up to whole pages and served from exact-size free
// lists, else from a fresh anonymous mapping.  A block freed goes back to its free list while the blocks in
// use plus the blocks cached stay within `limit`; otherwise it is unmapped at once.  A request that misses
// the cache and has no room under the limit takes a cached block of another size and resizes it (`mremap`:
// its pages stay resident, only what it grows by faults in), then unmaps cached blocks (largest first) until
// the new block fits.  So the resident memory of the large blocks never exceeds max(limit, bytes in use):
// whatever the cache holds counts in the budget the limit is set to.  Small requests go to malloc (glibc
// keeps them in its heap either way).
//
// Registered with c10::SetCPUAllocator; driven from Python through the C functions at the end (ctypes), so
// the library links against libc10 only.  See engine/allocator/__init__.py.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kAlignment = 64;  // what PyTorch's default CPU allocator aligns to
constexpr size_t kHugeBytes = 2 << 20;  // blocks from this size up are advised to use transparent huge pages

struct Stats {
  uint64_t live_bytes = 0;      // large blocks in use
  uint64_t cached_bytes = 0;    // large blocks freed and kept for reuse
  uint64_t peak_bytes = 0;      // the most live + cached ever held
  uint64_t hits = 0;            // large requests served from the cache
  uint64_t misses = 0;          // large requests that mapped fresh memory
  uint64_t released_bytes = 0;  // unmapped to stay within the limit (or by empty_cache)
  uint64_t resized = 0;         // large requests served by resizing a cached block of another size
};

class CachingAllocator final : public c10::Allocator {
 public:
  CachingAllocator() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {}

  c10::DataPtr allocate(size_t n) override {
    if (n == 0) {
      return {nullptr, nullptr, &Delete, c10::Device(c10::DeviceType::CPU)};
    }
    void* p = n >= threshold_ ? AllocateLarge(n) : AllocateSmall(n);
    c10::profiledCPUMemoryReporter().New(p, n);  // as PyTorch's own CPU allocator: the profiler sees it
    return {p, p, &Delete, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void Delete(void* p);

  void Free(void* p) {
    if (p == nullptr) return;
    size_t size = 0;  // stays 0 for a small block (not in live_)
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(p);
      if (it != live_.end()) {
        size = it->second;
        live_.erase(it);
        stats_.live_bytes -= size;
        if (stats_.live_bytes + stats_.cached_bytes + size <= limit_) {
          free_[size].push_back(p);
          stats_.cached_bytes += size;
          return;
        }
        stats_.released_bytes += size;
      }
    }
    if (size == 0) {
      std::free(p);
    } else {
      munmap(p, size);
    }
  }

  void SetLimit(uint64_t limit) {
    std::vector<std::pair<void*, size_t>> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = limit;
      TrimTo(limit_, &released);
    }
    Unmap(released);
  }

  // Every large block handed out filled with 0xFF bytes (NaN as floats): code that reads memory it never wrote
  // then shows it, where fresh mappings (zeros) would hide it.  For tests.
  void SetPoison(bool poison) {
    std::lock_guard<std::mutex> lock(mutex_);
    poison_ = poison;
  }

  void SetHugePages(bool huge) {
    std::lock_guard<std::mutex> lock(mutex_);
    huge_pages_ = huge;
  }

  void SetThreshold(uint64_t threshold) {
    std::lock_guard<std::mutex> lock(mutex_);
    threshold_ = threshold < page_ ? page_ : threshold;
  }

  void EmptyCache() {
    std::vector<std::pair<void*, size_t>> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TrimTo(0, &released);
    }
    Unmap(released);
  }

  Stats GetStats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void ResetPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes = stats_.live_bytes + stats_.cached_bytes;
  }

  uint64_t limit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }

  // fork: a child must not inherit the mutex held by another thread
  void LockForFork() { mutex_.lock(); }
  void UnlockAfterFork() { mutex_.unlock(); }

 private:
  void* AllocateSmall(size_t n) {
    void* p = nullptr;
    if (posix_memalign(&p, kAlignment, n) != 0 || p == nullptr) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU caching allocator: can't allocate ",
                       n, " bytes");
    }
    return p;
  }

  void* AllocateLarge(size_t n) {
    const size_t size = (n + page_ - 1) / page_ * page_;
    std::vector<std::pair<void*, size_t>> released;
    std::pair<void*, size_t> reused{nullptr, 0};
    bool huge = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);
        stats_.cached_bytes -= size;
        Track(p, size);
        stats_.hits += 1;
        if (poison_) std::memset(p, 0xFF, size);
        return p;
      }
      huge = huge_pages_;
      if (stats_.live_bytes + stats_.cached_bytes + size > limit_ && stats_.cached_bytes > 0) {
        reused = TakeForResize(size);
      } else {
        stats_.misses += 1;
      }
      // room under the limit for the new block: cached blocks go first
      TrimTo(limit_ > size ? limit_ - size : 0, &released);
      stats_.live_bytes += size;  // reserved now so that concurrent requests see it
      Peak();
    }
    Unmap(released);
    const bool advise = huge && size >= kHugeBytes;
    void* p = reused.first != nullptr ? Resize(reused, size) : Map(size, advise);
    // A block the limit made us unmap faults back in on its next use: with transparent huge pages that is one
    // fault per 2 MiB instead of 512 (resnet18's steps at a whole-step budget: 1.11x plain's time -> 1.04x).
    // RSS still follows the block: only whole, aligned 2 MiB ranges of it become huge pages, once touched.
    if (p != MAP_FAILED && advise) madvise(p, size, MADV_HUGEPAGE);
    if (p == MAP_FAILED) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.live_bytes -= size;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU caching allocator: can't map ", size, " bytes: ",
                       std::strerror(errno));
    }
    if (poison_) std::memset(p, 0xFF, size);
    std::lock_guard<std::mutex> lock(mutex_);
    live_[p] = size;
    return p;
  }

  void Track(void* p, size_t size) {
    live_[p] = size;
    stats_.live_bytes += size;
    Peak();
  }

  void Peak() {
    const uint64_t held = stats_.live_bytes + stats_.cached_bytes;
    if (held > stats_.peak_bytes) stats_.peak_bytes = held;
  }

  // A cached block to resize into a request of `size` bytes that has no room under the limit (under the
  // mutex): the smallest one at least as large (shrunk in place, nothing faults), else the largest one (what it
  // grows by faults).  Unmapping it and mapping afresh would fault and zero every page again: resnet18's steps
  // at half of a plain step's memory did that to 190 MB a step.
  std::pair<void*, size_t> TakeForResize(size_t size) {
    auto it = free_.lower_bound(size);
    if (it == free_.end()) it = std::prev(free_.end());
    const std::pair<void*, size_t> block{it->second.back(), it->first};
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    stats_.cached_bytes -= block.second;
    stats_.resized += 1;
    if (block.second > size) stats_.released_bytes += block.second - size;  // the tail a shrink unmaps
    return block;
  }

  // A fresh mapping of `size` bytes (a multiple of the page); with `aligned`, starting on a 2 MiB boundary, so
  // that every whole 2 MiB of it can be a huge page (mmap's own address is page-aligned only: a 4 MiB block
  // then holds one huge page, not two).  The over-mapped head and tail are unmapped at once: never touched,
  // they were never resident.
  static void* Map(size_t size, bool aligned) {
    if (!aligned) return mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* raw = mmap(nullptr, size + kHugeBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return raw;
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t begin = (start + kHugeBytes - 1) & ~static_cast<uintptr_t>(kHugeBytes - 1);
    if (begin > start) munmap(raw, begin - start);
    const uintptr_t end = start + size + kHugeBytes;
    if (end > begin + size) munmap(reinterpret_cast<void*>(begin + size), end - begin - size);
    return reinterpret_cast<void*>(begin);
  }

  // `block` (taken by TakeForResize, outside the mutex) resized to `size` bytes; a fresh mapping if the kernel
  // refuses.
  static void* Resize(std::pair<void*, size_t> block, size_t size) {
    void* p = mremap(block.first, block.second, size, MREMAP_MAYMOVE);
    if (p != MAP_FAILED) return p;
    munmap(block.first, block.second);
    return mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }

  // Take cached blocks off the free lists, largest first, until live + cached <= target (under the mutex);
  // the caller unmaps them after releasing it.
  void TrimTo(uint64_t target, std::vector<std::pair<void*, size_t>>* released) {
    while (stats_.cached_bytes > 0 && stats_.live_bytes + stats_.cached_bytes > target) {
      auto largest = std::prev(free_.end());
      void* p = largest->second.back();
      const size_t size = largest->first;
      largest->second.pop_back();
      if (largest->second.empty()) free_.erase(largest);
      stats_.cached_bytes -= size;
      stats_.released_bytes += size;
      released->emplace_back(p, size);
    }
  }

  static void Unmap(const std::vector<std::pair<void*, size_t>>& released) {
    for (const auto& [p, size] : released) munmap(p, size);
  }

  const size_t page_;
  std::mutex mutex_;
  uint64_t threshold_ = 64 << 10;
  bool poison_ = false;
  bool huge_pages_ = true;
  uint64_t limit_ = UINT64_MAX;
  std::unordered_map<void*, size_t> live_;
  std::map<size_t, std::vector<void*>> free_;  // by size, so the largest can be released first
  Stats stats_;
};

CachingAllocator* Instance() {
  static CachingAllocator* instance = new CachingAllocator();  // never destroyed: blocks outlive static teardown
  return instance;
}

void CachingAllocator::Delete(void* p) {
  if (p == nullptr) return;
  c10::profiledCPUMemoryReporter().Delete(p);
  Instance()->Free(p);
}

}  // namespace

#define POET_EXPORT __attribute__((visibility("default")))

extern "C" {

// Make this allocator PyTorch's CPU allocator (idempotent); returns 1.
POET_EXPORT int poet_allocator_install(uint64_t threshold, uint64_t limit) {
  static std::once_flag once;
  CachingAllocator* allocator = Instance();
  allocator->SetThreshold(threshold);
  allocator->SetLimit(limit);
  std::call_once(once, [allocator] {
    pthread_atfork([] { Instance()->LockForFork(); }, [] { Instance()->UnlockAfterFork(); },
                   [] { Instance()->UnlockAfterFork(); });
    c10::SetCPUAllocator(allocator, /*priority=*/10);
  });
  return c10::GetCPUAllocator() == allocator ? 1 : 0;
}

POET_EXPORT void poet_allocator_set_poison(int poison) { Instance()->SetPoison(poison != 0); }

POET_EXPORT void poet_allocator_set_huge_pages(int huge) { Instance()->SetHugePages(huge != 0); }

POET_EXPORT void poet_allocator_set_limit(uint64_t limit) { Instance()->SetLimit(limit); }

POET_EXPORT uint64_t poet_allocator_limit() { return Instance()->limit(); }

POET_EXPORT void poet_allocator_empty_cache() { Instance()->EmptyCache(); }

POET_EXPORT void poet_allocator_reset_peak() { Instance()->ResetPeak(); }

// live, cached, peak, hits, misses, released, resized
POET_EXPORT void poet_allocator_stats(uint64_t* out) {
  const Stats s = Instance()->GetStats();
  out[0] = s.live_bytes;
  out[1] = s.cached_bytes;
  out[2] = s.peak_bytes;
  out[3] = s.hits;
  out[4] = s.misses;
  out[5] = s.released_bytes;
  out[6] = s.resized;
}

}  // extern "C"
