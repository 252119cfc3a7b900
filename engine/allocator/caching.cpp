// A caching CPU allocator for PyTorch, bounded by a byte limit: large blocks freed by one step are handed
// out again to later requests instead of being unmapped and faulted back in.
//
// Large requests (at least `threshold` bytes) are rounded up to whole pages and served from the cache's free
// lists: a block of their size, else the head of the smallest cached block large enough (its tail stays cached:
// no system call).  Else, while the blocks in use plus the blocks cached leave room for it under `limit`, from
// a fresh anonymous mapping; without room, from cached blocks moved side by side into one range (`mremap` moves
// their page tables: nothing is faulted in or zeroed), with a fresh mapping only for what the cache lacks.  A
// block freed joins its cached neighbours and goes back to the free lists while the blocks in use plus the
// blocks cached stay within `limit`; otherwise it is unmapped at once.  So the resident memory of the large
// blocks never exceeds max(limit, bytes in use), whatever the cache holds counts in the budget the limit is set
// to, and a step that repeats the one before faults nothing in once the blocks held reach the limit.  Small
// requests go to malloc (glibc keeps them in its heap either way).
//
// Registered with c10::SetCPUAllocator; driven from Python through the C functions at the end (ctypes), so
// the library links against libc10 only.  See engine/allocator/__init__.py.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
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
  uint64_t reshaped = 0;        // large requests with no room served from cached blocks of other sizes
  uint64_t moved = 0;           // cached ranges moved (mremap) into the range of another request
};

// A range of a block that lies inside one kernel mapping (mremap moves a range of one mapping only).  Every
// mapping the allocator makes, or makes by moving a range, gets a number of its own: two adjacent pieces of the
// same number are still in one mapping (nothing between them was moved or unmapped, or they would not be
// adjacent), so they merge back into one piece when their blocks do.
struct Piece {
  size_t length;
  uint64_t mapping;
};

// A large block: `size` bytes from `ptr`, in consecutive pieces, so that a block made of moved blocks can be
// moved again piece by piece.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  std::vector<Piece> pieces;

  char* end() const { return static_cast<char*>(ptr) + size; }
};

// A request is not gathered from more pieces than this: a fresh mapping is cheaper than that many moves.
constexpr size_t kMaxPieces = 64;

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
    Block block;  // stays empty for a small block (not in live_)
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(p);
      if (it != live_.end()) {
        block = std::move(it->second);
        live_.erase(it);
        stats_.live_bytes -= block.size;
        if (stats_.live_bytes + stats_.cached_bytes + block.size <= limit_) {
          Cache(std::move(block));
          return;
        }
        stats_.released_bytes += block.size;
      }
    }
    if (block.size == 0) {
      heap_freed_.fetch_add(malloc_usable_size(p), std::memory_order_relaxed);
      std::free(p);
    } else {
      munmap(block.ptr, block.size);
    }
  }

  void SetLimit(uint64_t limit) {
    std::vector<Block> released;
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
    std::vector<Block> released;
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

  // Bytes of small blocks given back to malloc since the allocator was installed: what can have left free pages
  // in glibc's heap (the executor asks glibc how much of its heap is free only once this has grown enough).
  uint64_t heap_freed() const { return heap_freed_.load(std::memory_order_relaxed); }

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
    std::vector<Block> gathered;  // cached blocks to move into the new block's range
    std::vector<Block> released;
    bool advise = false;
    uint64_t numbers = 0;  // the last of the mapping numbers this block's pieces take
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        stats_.hits += 1;
        return HandOut(Uncache(it));
      }
      auto fit = free_.lower_bound(size);
      if (fit != free_.end()) {  // the head of the smallest cached block large enough; its tail stays cached
        stats_.reshaped += 1;
        Block block = Uncache(fit);
        Cache(Cut(&block, size));
        return HandOut(std::move(block));
      }
      advise = huge_pages_ && size >= kHugeBytes;
      if (stats_.live_bytes + stats_.cached_bytes + size > limit_ && stats_.cached_bytes > 0) {
        // no room for fresh memory: cached blocks, moved together, serve it; their pages fault nothing in
        stats_.reshaped += 1;
        gathered = Gather(size);
      } else {
        stats_.misses += 1;
      }
      // room under the limit for what the cache did not give: cached blocks go first
      TrimTo(limit_ > size ? limit_ - size : 0, &released);
      stats_.live_bytes += size;  // reserved now so that concurrent requests see it
      Peak();
      mappings_ += 1 + CountPieces(gathered);  // one for the fresh mapping, one for every range moved into it
      numbers = mappings_;
    }
    Unmap(released);
    void* p = Map(size, advise);
    if (p == MAP_FAILED) {
      const int error = errno;
      Unmap(gathered);  // taken off the free lists for this request: given back to the system with it
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Block& block : gathered) stats_.released_bytes += block.size;
      stats_.live_bytes -= size;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU caching allocator: can't map ", size, " bytes: ",
                       std::strerror(error));
    }
    Block block{p, size, {}};
    const size_t moved = MoveInto(gathered, numbers, &block);
    // A block the limit made us unmap faults back in on its next use: with transparent huge pages that is one
    // fault per 2 MiB instead of 512 (resnet18's steps at a whole-step budget: 1.11x plain's time -> 1.04x).
    // RSS still follows the block: only whole, aligned 2 MiB ranges of it become huge pages, once touched.
    if (advise) madvise(p, size, MADV_HUGEPAGE);
    if (poison_) std::memset(p, 0xFF, size);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.moved += moved;
    live_[p] = std::move(block);
    return p;
  }

  // `block`, off the free lists, handed out (under the mutex)
  void* HandOut(Block block) {
    void* p = block.ptr;
    stats_.live_bytes += block.size;
    Peak();
    if (poison_) std::memset(p, 0xFF, block.size);
    live_[p] = std::move(block);
    return p;
  }

  // `block` on the free lists, merged with the cached blocks right before and after it (under the mutex): so
  // the pieces a cut made join again, and the cache holds few large blocks rather than many small ones.
  void Cache(Block block) {
    stats_.cached_bytes += block.size;
    auto after = free_at_.find(block.end());
    if (after != free_at_.end()) block = Join(std::move(block), TakeFree(after->first, after->second));
    auto before = free_at_.lower_bound(static_cast<char*>(block.ptr));
    if (before != free_at_.begin()) {
      --before;
      if (before->first + before->second == block.ptr) {
        block = Join(TakeFree(before->first, before->second), std::move(block));
      }
    }
    free_at_[static_cast<char*>(block.ptr)] = block.size;
    free_[block.size].push_back(std::move(block));
  }

  // The cached block at `ptr` of `size` bytes, off the free lists (its bytes still counted as cached)
  Block TakeFree(char* ptr, size_t size) {
    free_at_.erase(ptr);
    auto it = free_.find(size);
    auto& blocks = it->second;
    for (auto b = blocks.begin(); b != blocks.end(); ++b) {
      if (b->ptr == ptr) {
        Block block = std::move(*b);
        blocks.erase(b);
        if (blocks.empty()) free_.erase(it);
        return block;
      }
    }
    TORCH_CHECK(false, "CPU caching allocator: no cached block at ", static_cast<void*>(ptr));
  }

  // `low` and `high` (which starts where `low` ends) as one block
  static Block Join(Block low, Block high) {
    const size_t first = low.pieces.size();
    low.pieces.insert(low.pieces.end(), high.pieces.begin(), high.pieces.end());
    if (low.pieces[first - 1].mapping == low.pieces[first].mapping) {  // one piece a cut had split
      low.pieces[first - 1].length += low.pieces[first].length;
      low.pieces.erase(low.pieces.begin() + first);
    }
    low.size += high.size;
    return low;
  }

  Block Uncache(std::map<size_t, std::vector<Block>>::iterator it) {
    Block block = std::move(it->second.back());
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    free_at_.erase(static_cast<char*>(block.ptr));
    stats_.cached_bytes -= block.size;
    return block;
  }

  static size_t CountPieces(const std::vector<Block>& blocks) {
    size_t pieces = 0;
    for (const Block& block : blocks) pieces += block.pieces.size();
    return pieces;
  }

  void Peak() {
    const uint64_t held = stats_.live_bytes + stats_.cached_bytes;
    if (held > stats_.peak_bytes) stats_.peak_bytes = held;
  }

  // `block` cut after its first `size` bytes (less than its size): it keeps the head, the tail is returned.
  // The cut needs no system call: both parts stay in the mappings they were in.
  static Block Cut(Block* block, size_t size) {
    Block tail{static_cast<char*>(block->ptr) + size, block->size - size, {}};
    size_t offset = 0;
    size_t i = 0;
    while (offset + block->pieces[i].length <= size) offset += block->pieces[i++].length;
    // pieces before i lie in the head; piece i starts at or before the cut and ends past it
    const size_t in_head = size - offset;
    tail.pieces.push_back({block->pieces[i].length - in_head, block->pieces[i].mapping});
    tail.pieces.insert(tail.pieces.end(), block->pieces.begin() + i + 1, block->pieces.end());
    block->pieces.resize(in_head > 0 ? i + 1 : i);
    if (in_head > 0) block->pieces[i].length = in_head;
    block->size = size;
    return tail;
  }

  // Cached blocks, largest first, that together make up to `size` bytes (under the mutex; every cached block is
  // smaller than `size`): the last one is cut, its tail stays cached.
  std::vector<Block> Gather(size_t size) {
    std::vector<Block> gathered;
    size_t bytes = 0;
    size_t pieces = 0;
    while (bytes < size && !free_.empty()) {
      auto largest = std::prev(free_.end());
      if (pieces + largest->second.back().pieces.size() > kMaxPieces) break;
      Block block = Uncache(largest);
      if (bytes + block.size > size) Cache(Cut(&block, size - bytes));
      bytes += block.size;
      pieces += block.pieces.size();
      gathered.push_back(std::move(block));
    }
    return gathered;
  }

  // The pieces of `gathered` moved, side by side, to the start of `block` (a fresh mapping): their page tables
  // move, their pages stay resident.  What they do not cover stays fresh.  Records the block's pieces, numbered
  // down from `number` (each moved piece is a mapping of its own now), and returns how many moved.  A piece the
  // kernel refuses to move is unmapped and its place mapped afresh.
  static size_t MoveInto(const std::vector<Block>& gathered, uint64_t number, Block* block) {
    char* to = static_cast<char*>(block->ptr);
    size_t moved = 0;
    for (const Block& from : gathered) {
      char* source = static_cast<char*>(from.ptr);
      for (const Piece& piece : from.pieces) {
        const size_t length = piece.length;
        if (mremap(source, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, to) != MAP_FAILED) {
          moved += 1;
        } else {
          munmap(source, length);
          // MREMAP_FIXED may have unmapped the destination before failing
          if (mmap(to, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
              MAP_FAILED) {
            TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU caching allocator: can't map ", length,
                             " bytes in place: ", std::strerror(errno));
          }
        }
        block->pieces.push_back({length, number--});
        source += length;
        to += length;
      }
    }
    const size_t covered = to - static_cast<char*>(block->ptr);
    if (covered < block->size) block->pieces.push_back({block->size - covered, number});
    return moved;
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

  // Take cached blocks off the free lists, largest first, until live + cached <= target (under the mutex);
  // the caller unmaps them after releasing it.
  void TrimTo(uint64_t target, std::vector<Block>* released) {
    while (stats_.cached_bytes > 0 && stats_.live_bytes + stats_.cached_bytes > target) {
      Block block = Uncache(std::prev(free_.end()));
      stats_.released_bytes += block.size;
      released->push_back(std::move(block));
    }
  }

  static void Unmap(const std::vector<Block>& released) {
    for (const Block& block : released) munmap(block.ptr, block.size);
  }

  const size_t page_;
  std::mutex mutex_;
  uint64_t threshold_ = 64 << 10;
  bool poison_ = false;
  bool huge_pages_ = true;
  uint64_t limit_ = UINT64_MAX;
  uint64_t mappings_ = 0;  // mapping numbers handed out
  std::atomic<uint64_t> heap_freed_{0};
  std::unordered_map<void*, Block> live_;
  std::map<size_t, std::vector<Block>> free_;  // cached blocks by size: the best fit, and the largest to release
  std::map<char*, size_t> free_at_;            // ... by address, to merge neighbours
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

POET_EXPORT uint64_t poet_allocator_heap_freed() { return Instance()->heap_freed(); }

POET_EXPORT void poet_allocator_empty_cache() { Instance()->EmptyCache(); }

POET_EXPORT void poet_allocator_reset_peak() { Instance()->ResetPeak(); }

// live, cached, peak, hits, misses, released, reshaped, moved
POET_EXPORT void poet_allocator_stats(uint64_t* out) {
  const Stats s = Instance()->GetStats();
  out[0] = s.live_bytes;
  out[1] = s.cached_bytes;
  out[2] = s.peak_bytes;
  out[3] = s.hits;
  out[4] = s.misses;
  out[5] = s.released_bytes;
  out[6] = s.reshaped;
  out[7] = s.moved;
}

}  // extern "C"
