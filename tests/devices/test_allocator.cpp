// The caching allocators through their public API (weft/allocator.h): reuse
// and cache hits, size classes, empty blocks, the arithmetic of the stats,
// release_cached, alignment, what cpu_pinned is without a GPU, gpu(0) on a
// machine without one, and allocate/free from several threads at once.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "weft/allocator.h"
#include "weft/device.h"
#include "weft/error.h"
#include "weft/gpu.h"

using weft::Allocator;
using weft::Block;
using weft::Device;
using weft::MemoryStats;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

// The size class a request of `bytes` gets, as seen in in_use.
std::size_t class_of(Allocator& a, std::size_t bytes) {
  const std::size_t before = a.stats().in_use;
  Block b = a.allocate(bytes);
  const std::size_t cls = a.stats().in_use - before;
  a.free(b);
  return cls;
}

const Device kHostDevices[] = {Device::cpu(0), Device::cpu(1), Device::cpu_pinned(0)};

}  // namespace

TEST_CASE("allocator: a freed block comes back for the same size class" * doctest::timeout(30)) {
  for (Device d : kHostDevices) {
    INFO(d.str());
    auto a = weft::make_caching_allocator(d);
    CHECK(a->device() == d);
    Block b1 = a->allocate(100);
    REQUIRE(b1);
    CHECK(b1.bytes == 100);
    void* p = b1.ptr;
    std::memset(p, 0xab, 100);  // usable
    MemoryStats s = a->stats();
    CHECK(s.allocations == 1);
    CHECK(s.cache_hits == 0);
    a->free(b1);
    Block b2 = a->allocate(100);
    CHECK(b2.ptr == p);
    CHECK(a->stats().cache_hits == 1);
    a->free(b2);
    Block b3 = a->allocate(300);  // same 512-byte class
    CHECK(b3.ptr == p);
    CHECK(b3.bytes == 300);
    s = a->stats();
    CHECK(s.allocations == 3);
    CHECK(s.cache_hits == 2);
    CHECK(s.reserved == 512);
    // while b3 is held, the same class needs new memory
    Block b4 = a->allocate(200);
    CHECK(b4.ptr != p);
    CHECK(a->stats().cache_hits == 2);
    CHECK(a->stats().reserved == 1024);
    // another class does not take a cached block of this one
    a->free(b4);
    Block big = a->allocate(4 * KiB);
    CHECK(big.ptr != b4.ptr);
    CHECK(a->stats().cache_hits == 2);
    a->free(big);
    a->free(b3);
    CHECK(a->stats().in_use == 0);
    a->release_cached();
    CHECK(a->stats().reserved == 0);
  }
}

TEST_CASE("allocator: size classes" * doctest::timeout(30)) {
  auto a = weft::make_caching_allocator(Device::cpu(0));
  // 512-byte steps up to 1 MiB: 1 byte and 511 bytes share a class
  CHECK(class_of(*a, 1) == 512);
  CHECK(class_of(*a, 511) == 512);
  CHECK(class_of(*a, 512) == 512);
  CHECK(class_of(*a, 513) == 1024);
  CHECK(class_of(*a, MiB) == MiB);
  {
    Block one = a->allocate(1);
    void* p = one.ptr;
    a->free(one);
    const auto hits = a->stats().cache_hits;
    Block b = a->allocate(511);
    CHECK(b.ptr == p);
    CHECK(a->stats().cache_hits == hits + 1);
    a->free(b);
  }
  // above 1 MiB: rounded up by at most a 32nd, never down
  for (std::size_t bytes : {MiB + 1, MiB + 300 * KiB, 2 * MiB - 1, 3 * MiB + 5, 5 * MiB, 7 * MiB + 333,
                            16 * MiB + 1, 48 * MiB + 7}) {
    INFO(bytes);
    const std::size_t cls = class_of(*a, bytes);
    CHECK(cls >= bytes);
    CHECK(static_cast<double>(cls) <= (1.0 + 1.0 / 32) * static_cast<double>(bytes));
  }
  // nearby sizes above 1 MiB share a class (the last, smaller minibatch hits the cache)
  CHECK(class_of(*a, MiB + 1) == class_of(*a, MiB + 1000));
  CHECK(class_of(*a, 5 * MiB) < class_of(*a, 5 * MiB + 1));  // 5 MiB is a class of its own
  {
    Block b = a->allocate(3 * MiB + 5);
    void* p = b.ptr;
    a->free(b);
    Block c = a->allocate(3 * MiB + 60 * KiB);
    CHECK(c.ptr == p);
    a->free(c);
  }
  a->release_cached();
  CHECK(a->stats().reserved == 0);
}

TEST_CASE("allocator: zero bytes give an empty block" * doctest::timeout(30)) {
  for (Device d : kHostDevices) {
    INFO(d.str());
    auto a = weft::make_caching_allocator(d);
    Block b = a->allocate(0);
    CHECK(!b);
    CHECK(b.ptr == nullptr);
    CHECK(b.bytes == 0);
    const MemoryStats s = a->stats();
    CHECK(s.in_use == 0);
    CHECK(s.reserved == 0);
    a->free(b);  // a no-op
    a->free(Block{});
    CHECK(a->stats().in_use == 0);
  }
}

TEST_CASE("allocator: in_use peak and reserved arithmetic and release_cached" * doctest::timeout(30)) {
  for (Device d : kHostDevices) {
    INFO(d.str());
    auto a = weft::make_caching_allocator(d);
    Block x = a->allocate(1000);   // class 1024
    Block y = a->allocate(5000);   // class 5120
    Block z = a->allocate(70000);  // class 70144
    MemoryStats s = a->stats();
    CHECK(s.in_use == 1024 + 5120 + 70144);
    CHECK(s.peak_in_use == s.in_use);
    CHECK(s.reserved == s.in_use);
    CHECK(s.allocations == 3);
    a->free(y);
    s = a->stats();
    CHECK(s.in_use == 1024 + 70144);
    CHECK(s.peak_in_use == 1024 + 5120 + 70144);
    CHECK(s.reserved == 1024 + 5120 + 70144);  // y is cached
    a->reset_peak();
    CHECK(a->stats().peak_in_use == 1024 + 70144);
    a->release_cached();
    s = a->stats();
    CHECK(s.reserved == s.in_use);  // cached blocks gone, blocks in use kept
    CHECK(s.in_use == 1024 + 70144);
    // x and z are still usable after release_cached
    std::memset(x.ptr, 1, 1000);
    std::memset(z.ptr, 2, 70000);
    a->free(x);
    a->free(z);
    s = a->stats();
    CHECK(s.in_use == 0);
    CHECK(s.peak_in_use == 1024 + 70144);
    CHECK(s.reserved == 1024 + 70144);
    a->release_cached();
    CHECK(a->stats().reserved == 0);
    // a fresh allocation after the release is a miss
    const auto hits = a->stats().cache_hits;
    Block w = a->allocate(1000);
    CHECK(a->stats().cache_hits == hits);
    CHECK(a->stats().peak_in_use == 1024 + 70144);  // the old peak stands
    a->free(w);
  }
}

TEST_CASE("allocator: blocks are 64-byte aligned" * doctest::timeout(30)) {
  for (Device d : kHostDevices) {
    INFO(d.str());
    auto a = weft::make_caching_allocator(d);
    std::vector<Block> blocks;
    for (std::size_t bytes : {std::size_t{1}, std::size_t{3}, std::size_t{63}, std::size_t{64}, std::size_t{65},
                              std::size_t{511}, std::size_t{4097}, 100 * KiB + 3, MiB + 1, 3 * MiB + 7}) {
      blocks.push_back(a->allocate(bytes));
      INFO(bytes);
      CHECK(aligned64(blocks.back().ptr));
    }
    for (Block& b : blocks) a->free(b);
    // and again from the cache
    for (std::size_t bytes : {std::size_t{1}, std::size_t{65}, MiB + 1}) {
      Block b = a->allocate(bytes);
      CHECK(aligned64(b.ptr));
      a->free(b);
    }
  }
}

TEST_CASE("allocator: memory kinds and devices without memory" * doctest::timeout(30)) {
  CHECK(weft::make_caching_allocator(Device::cpu(0))->memory_kind() == "pageable");
  CHECK(weft::make_caching_allocator(Device::cpu(3))->device() == Device::cpu(3));
  if (weft::gpu::device_count() == 0) {
    auto pinned = weft::make_caching_allocator(Device::cpu_pinned(0));
    const std::string kind = pinned->memory_kind();
    INFO(kind);
    CHECK(kind.find("pageable") != std::string::npos);
    CHECK(kind != "pinned");
    try {
      auto g = weft::make_caching_allocator(Device::gpu(0));
      FAIL("gpu(0) allocator created on a machine without a GPU");
    } catch (const weft::Error& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(m.find("gpu(0)") != std::string::npos);
    }
    try {
      auto g = weft::make_caching_allocator(Device::gpu(2));
      FAIL("gpu(2) allocator created on a machine without a GPU");
    } catch (const weft::Error& e) {
      CHECK(std::string(e.what()).find("gpu(2)") != std::string::npos);
    }
  } else {
    MESSAGE("a GPU answers: checking that cpu_pinned is page-locked and gpu(0) is device memory instead");
    CHECK(weft::make_caching_allocator(Device::cpu_pinned(0))->memory_kind() == "pinned");
    CHECK(weft::make_caching_allocator(Device::gpu(0))->memory_kind() == "device");
  }
}

TEST_CASE("allocator: blocks belong to their stream" * doctest::timeout(30)) {
  // Stream handles are only keys on a host allocator with no other-stream
  // uses: a block freed by one stream is reused by that stream, not another.
  auto a = weft::make_caching_allocator(Device::cpu(0));
  alignas(64) static char s1_tag, s2_tag;
  auto* s1 = reinterpret_cast<weft::gpu::Stream*>(&s1_tag);
  auto* s2 = reinterpret_cast<weft::gpu::Stream*>(&s2_tag);
  Block b = a->allocate(256, s1);
  void* p = b.ptr;
  a->record_use(b, s1);  // the allocating stream itself: nothing to track
  a->free(b);
  Block other = a->allocate(256, s2);
  CHECK(other.ptr != p);
  Block same = a->allocate(256, s1);
  CHECK(same.ptr == p);
  CHECK(a->stats().cache_hits == 1);
  a->free(other);
  a->free(same);
  CHECK(a->stats().in_use == 0);
}

TEST_CASE("allocator: concurrent allocate and free from four threads" * doctest::timeout(60)) {
  for (Device d : {Device::cpu(0), Device::cpu_pinned(0)}) {
    INFO(d.str());
    auto a = weft::make_caching_allocator(d);
    constexpr int kThreads = 4, kIters = 10000, kHeld = 8;
    std::atomic<int> corrupt{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t) + 1);
        std::vector<Block> held;
        std::vector<unsigned char> tags;
        for (int i = 0; i < kIters; ++i) {
          if (held.size() == kHeld || (!held.empty() && rng() % 2)) {
            const std::size_t k = rng() % held.size();
            // nobody else wrote into this block while it was ours
            const auto* bytes = static_cast<const unsigned char*>(held[k].ptr);
            if (held[k] && (bytes[0] != tags[k] || bytes[held[k].bytes - 1] != tags[k])) corrupt.fetch_add(1);
            a->free(held[k]);
            held.erase(held.begin() + static_cast<long>(k));
            tags.erase(tags.begin() + static_cast<long>(k));
          }
          // mostly small sizes from a few classes (cache hits), sometimes 0 or large
          const unsigned r = rng() % 100;
          const std::size_t bytes = r < 2 ? 0 : r < 5 ? (rng() % (3 * MiB)) + 1 : 64 * (1 + rng() % 64);
          Block b = a->allocate(bytes);
          const auto tag = static_cast<unsigned char>(t * 37 + i);
          if (b) {
            if (!aligned64(b.ptr)) corrupt.fetch_add(1);
            std::memset(b.ptr, tag, b.bytes);
          }
          held.push_back(b);
          tags.push_back(tag);
        }
        for (Block& b : held) a->free(b);
      });
    for (auto& th : threads) th.join();
    const MemoryStats s = a->stats();
    CHECK(corrupt.load() == 0);
    CHECK(s.in_use == 0);
    CHECK(s.allocations <= std::uint64_t{kThreads} * kIters);
    CHECK(s.allocations >= std::uint64_t{kThreads} * kIters * 9 / 10);  // all but the zero-byte ones
    CHECK(s.cache_hits > s.allocations / 2);
    CHECK(s.peak_in_use <= s.reserved);
    CHECK(s.peak_in_use > 0);
    a->release_cached();
    CHECK(a->stats().reserved == 0);
  }
}
