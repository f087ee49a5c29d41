// The GPU backend's contract, the same on real and simulated GPUs
// (devices/src/backend.h): streams run in order and asynchronously to the
// host, a stream wait blocks only its stream, a host wait blocks until the
// event is reached, a failed host function reaches the next event's waiter,
// copies move exactly their bytes, and the stream-aware allocator never hands
// a block to another stream while a stream that used it may still run. The
// timing-model checks hold on simulated GPUs only (they say so).
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "gpu_test_util.h"
#include "weft/allocator.h"
#include "weft/gpu_timing.h"

using namespace gputest;
namespace gpu = weft::gpu;

namespace {

// A host-side latch a stream can be made to wait on (a stand-in for a long kernel).
struct Latch {
  std::atomic<bool> open{false};
  void wait() const {
    while (!open.load(std::memory_order_acquire)) std::this_thread::yield();
  }
  void release() { open.store(true, std::memory_order_release); }
};

std::string exception_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("gpu backend - a stream runs its work in order and asynchronously to the host" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  gpu::StreamResources s(0, gpu::StreamRole::compute, 0);
  Latch latch;
  std::vector<int> order;  // written by the stream only, read after synchronize
  gpu::launch_host_func(s.handles().stream, [&] { latch.wait(); });
  for (int i = 0; i < 100; ++i) gpu::launch_host_func(s.handles().stream, [&order, i] { order.push_back(i); });
  // Enqueueing returned although the stream is blocked at its first item.
  gpu::Event* e = gpu::Event::record(0, s.handles().stream);
  gpu::EventRef done(e);
  latch.release();
  done->host_wait();
  s.synchronize();
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("gpu backend - a stream wait blocks only the waiting stream" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  // The producer is held by a host function; the consumer and the bystander
  // enqueue copies, not host functions: CUDA runs the host functions of all
  // streams on one runtime thread, so a second host function would queue
  // behind the blocked one whatever its stream.
  auto device_memory = weft::make_caching_allocator(Device::gpu(0));
  auto pinned = weft::make_caching_allocator(Device::cpu_pinned(0));
  gpu::StreamResources producer(0, gpu::StreamRole::compute, 0), consumer(0, gpu::StreamRole::compute, 0),
      bystander(0, gpu::StreamRole::compute, 0);
  weft::Block host = pinned->allocate(4 * sizeof(int));
  int* const produced = static_cast<int*>(host.ptr);  // [0] produced, [1] consumer's copy, [2] in, [3] out
  produced[0] = 0, produced[1] = -1, produced[2] = 7, produced[3] = 0;
  weft::Block on_consumer = device_memory->allocate(sizeof(int), consumer.handles().stream);
  weft::Block on_bystander = device_memory->allocate(sizeof(int), bystander.handles().stream);
  Latch latch;
  gpu::launch_host_func(producer.handles().stream, [&] {
    latch.wait();
    produced[0] = 42;
  });
  gpu::EventRef ready(gpu::Event::record(0, producer.handles().stream));
  ready->stream_wait(consumer.handles().stream);
  gpu::memcpy_async(on_consumer.ptr, &produced[0], sizeof(int), gpu::CopyKind::host_to_device,
                    consumer.handles().stream);
  gpu::memcpy_async(&produced[1], on_consumer.ptr, sizeof(int), gpu::CopyKind::device_to_host,
                    consumer.handles().stream);
  gpu::EventRef consumed(gpu::Event::record(0, consumer.handles().stream));
  gpu::memcpy_async(on_bystander.ptr, &produced[2], sizeof(int), gpu::CopyKind::host_to_device,
                    bystander.handles().stream);
  gpu::memcpy_async(&produced[3], on_bystander.ptr, sizeof(int), gpu::CopyKind::device_to_host,
                    bystander.handles().stream);
  bystander.synchronize();  // another stream of the device is not held up
  CHECK(produced[3] == 7);
  CHECK(!consumed->done());  // the consumer still waits for the producer
  CHECK(produced[1] == -1);
  latch.release();
  consumer.synchronize();
  CHECK(produced[1] == 42);
  device_memory->free(on_consumer);
  device_memory->free(on_bystander);
  pinned->free(host);
}

TEST_CASE("gpu backend - an event never recorded is complete and re-recording moves it" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  gpu::StreamResources s(0, gpu::StreamRole::compute, 0);
  gpu::TimingEvent a(0), b(0);
  CHECK(a.done());
  a.record(s.handles().stream);
  gpu::launch_host_func(s.handles().stream, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  b.record(s.handles().stream);
  b.synchronize();
  CHECK(a.done());
  CHECK(b.ms_since(a) >= 15.0f);  // the host function's 20 ms lay between them
  Latch latch;
  gpu::launch_host_func(s.handles().stream, [&] { latch.wait(); });
  b.record(s.handles().stream);
  CHECK(!b.done());  // the new recording is behind the latch
  latch.release();
  b.synchronize();
  CHECK(b.done());
}

TEST_CASE("gpu backend - a failed host function reaches the next event's waiter, later work runs" *
          doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  if (!simulated()) {
    // cudaLaunchHostFunc cannot fail its stream: CUDA reports the throw on stderr instead.
    std::printf("[weft-skip] simulated GPUs only\n");
    return;
  }
  gpu::StreamResources s(0, gpu::StreamRole::compute, 0), other(0, gpu::StreamRole::compute, 0);
  gpu::launch_host_func(s.handles().stream, [] { throw weft::Error("kernel failed on purpose"); });
  gpu::EventRef failed(gpu::Event::record(0, s.handles().stream));
  CHECK(exception_text([&] { failed->host_wait(); }).find("kernel failed on purpose") != std::string::npos);
  // What waited for it on another stream fails too; the stream itself goes on.
  gpu::launch_host_func(s.handles().stream, [] { throw weft::Error("second failure"); });
  gpu::EventRef second(gpu::Event::record(0, s.handles().stream));
  second->stream_wait(other.handles().stream);
  gpu::EventRef downstream(gpu::Event::record(0, other.handles().stream));
  CHECK(exception_text([&] { downstream->host_wait(); }).find("second failure") != std::string::npos);
  int ran = 0;
  gpu::launch_host_func(s.handles().stream, [&] { ++ran; });
  gpu::EventRef fine(gpu::Event::record(0, s.handles().stream));
  CHECK_NOTHROW(fine->host_wait());
  CHECK(ran == 1);
}

TEST_CASE("gpu backend - copies move exactly their bytes and check their pointers" * doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  const int gpus = std::min(2, gpu::device_count());
  std::vector<std::unique_ptr<weft::Allocator>> device_memory;
  for (int g = 0; g < gpus; ++g) device_memory.push_back(weft::make_caching_allocator(Device::gpu(g)));
  auto pinned = weft::make_caching_allocator(Device::cpu_pinned(0));
  gpu::StreamResources s0(0, gpu::StreamRole::h2d, 0);
  const std::size_t n = 100003;  // prime: no size happens to line up
  const std::vector<float> src = random_values(n, 7);
  weft::Block host_in = pinned->allocate(n * 4), host_out = pinned->allocate(n * 4);
  std::memcpy(host_in.ptr, src.data(), n * 4);
  std::memset(host_out.ptr, 0, n * 4);
  weft::Block d0 = device_memory[0]->allocate(n * 4, s0.handles().stream);
  weft::Block d0b = device_memory[0]->allocate(n * 4, s0.handles().stream);
  gpu::memcpy_async(d0.ptr, host_in.ptr, n * 4, gpu::CopyKind::host_to_device, s0.handles().stream);
  gpu::memcpy_async(d0b.ptr, d0.ptr, n * 4, gpu::CopyKind::device_to_device, s0.handles().stream);
  weft::Block last = d0b;
  std::unique_ptr<gpu::StreamResources> s1;
  weft::Block d1;
  if (gpus == 2) {
    s1 = std::make_unique<gpu::StreamResources>(1, gpu::StreamRole::peer, 0);
    d1 = device_memory[1]->allocate(n * 4, s1->handles().stream);
    gpu::EventRef copied(gpu::Event::record(0, s0.handles().stream));
    copied->stream_wait(s1->handles().stream);
    gpu::memcpy_peer_async(d1.ptr, 1, d0b.ptr, 0, n * 4, s1->handles().stream);
    gpu::EventRef peered(gpu::Event::record(1, s1->handles().stream));
    peered->stream_wait(s0.handles().stream);
    last = d1;
  }
  gpu::Stream* back = gpus == 2 ? s1->handles().stream : s0.handles().stream;
  gpu::memcpy_async(host_out.ptr, last.ptr, n * 4, gpu::CopyKind::device_to_host, back);
  if (s1) s1->synchronize();
  s0.synchronize();
  CHECK(std::memcmp(host_out.ptr, src.data(), n * 4) == 0);
  if (simulated()) {
    // Pointers that are not what the copy kind says are an error at enqueue time.
    const std::string wrong = exception_text(
        [&] { gpu::memcpy_async(host_out.ptr, host_in.ptr, 16, gpu::CopyKind::host_to_device, s0.handles().stream); });
    CHECK(wrong.find("not memory of gpu(0)") != std::string::npos);
    if (gpus == 2) {
      const std::string other = exception_text(
          [&] { gpu::memcpy_async(host_out.ptr, d1.ptr, 16, gpu::CopyKind::device_to_host, s0.handles().stream); });
      CHECK(other.find("belongs to gpu(1)") != std::string::npos);
    }
    const std::string past = exception_text(
        [&] { gpu::memcpy_async(host_out.ptr, d0.ptr, n * 4 + 4096, gpu::CopyKind::device_to_host, s0.handles().stream); });
    CHECK(past.find("past the end") != std::string::npos);
  }
  device_memory[0]->free(d0);
  device_memory[0]->free(d0b);
  if (gpus == 2) device_memory[1]->free(d1);
  pinned->free(host_in);
  pinned->free(host_out);
}

TEST_CASE("gpu backend - simulated copies take their modeled time on per-direction copy engines" *
          doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  if (!simulated()) {
    std::printf("[weft-skip] the timing model is the simulator's\n");
    return;
  }
  auto device_memory = weft::make_caching_allocator(Device::gpu(0));
  auto pinned = weft::make_caching_allocator(Device::cpu_pinned(0));
  const std::size_t bytes = std::size_t{64} << 20;  // 2.7 ms at 25 GB/s
  gpu::StreamResources a(0, gpu::StreamRole::d2h, 0), b(0, gpu::StreamRole::d2h, 0), c(0, gpu::StreamRole::h2d, 0);
  weft::Block d1 = device_memory->allocate(bytes, a.handles().stream), d2 = device_memory->allocate(bytes, b.handles().stream);
  weft::Block d3 = device_memory->allocate(bytes, c.handles().stream);
  weft::Block h1 = pinned->allocate(bytes), h2 = pinned->allocate(bytes), h3 = pinned->allocate(bytes);
  std::memset(h3.ptr, 1, bytes);
  auto timed = [](auto&& body) {
    const auto t0 = Clock::now();
    body();
    return seconds_since(t0);
  };
  // Warm the pages first.
  gpu::memcpy_async(h1.ptr, d1.ptr, bytes, gpu::CopyKind::device_to_host, a.handles().stream);
  gpu::memcpy_async(h2.ptr, d2.ptr, bytes, gpu::CopyKind::device_to_host, b.handles().stream);
  gpu::memcpy_async(d3.ptr, h3.ptr, bytes, gpu::CopyKind::host_to_device, c.handles().stream);
  a.synchronize();
  b.synchronize();
  c.synchronize();
  const double one = timed([&] {
    gpu::memcpy_async(h1.ptr, d1.ptr, bytes, gpu::CopyKind::device_to_host, a.handles().stream);
    a.synchronize();
  });
  // Two device->host copies on two streams share the one d2h engine.
  const double same_direction = timed([&] {
    gpu::memcpy_async(h1.ptr, d1.ptr, bytes, gpu::CopyKind::device_to_host, a.handles().stream);
    gpu::memcpy_async(h2.ptr, d2.ptr, bytes, gpu::CopyKind::device_to_host, b.handles().stream);
    a.synchronize();
    b.synchronize();
  });
  const double modeled = static_cast<double>(bytes) / 25e9;  // the default PCIe-like bandwidth
  MESSAGE("64 MiB device->host: one " << one * 1e3 << " ms (modeled at least " << modeled * 1e3
                                      << " ms), two on one engine " << same_direction * 1e3 << " ms");
  CHECK(one >= modeled * 0.95);
  CHECK(same_direction >= 2 * modeled * 0.95);
  device_memory->free(d1);
  device_memory->free(d2);
  device_memory->free(d3);
  pinned->free(h1);
  pinned->free(h2);
  pinned->free(h3);
}

TEST_CASE("gpu backend - a block another stream used is not reused before that use completed" *
          doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  auto alloc = weft::make_caching_allocator(Device::gpu(0));
  gpu::StreamResources mine(0, gpu::StreamRole::compute, 0), theirs(0, gpu::StreamRole::compute, 0);
  const std::size_t bytes = 1 << 20;
  weft::Block block = alloc->allocate(bytes, mine.handles().stream);
  void* const first = block.ptr;
  // Another stream still works on the block (a kernel behind a latch).
  Latch latch;
  alloc->record_use(block, theirs.handles().stream);
  gpu::launch_host_func(theirs.handles().stream, [&latch] { latch.wait(); });
  alloc->free(block);
  // While it may still run, the block is not handed out, not even to its own stream.
  weft::Block meanwhile = alloc->allocate(bytes, mine.handles().stream);
  CHECK(meanwhile.ptr != first);
  latch.release();
  theirs.synchronize();
  // Once that use has completed, the block comes back to its stream.
  weft::Block after = alloc->allocate(bytes, mine.handles().stream);
  CHECK(after.ptr == first);
  alloc->free(meanwhile);
  alloc->free(after);
}

// A freed block stays with its stream, whose queued work may still use it;
// giving the cache back to the system (as running out of memory does) must
// wait for that work, as cudaFree synchronizes. Without the wait a simulated
// stream writes into freed heap memory, which AddressSanitizer names here.
// The write is a copy queued behind a latched host function: a host function
// may not touch device memory on CUDA.
TEST_CASE("gpu backend - releasing the cache waits for work still queued on a block's stream" *
          doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  auto alloc = weft::make_caching_allocator(Device::gpu(0));
  auto pinned = weft::make_caching_allocator(Device::cpu_pinned(0));
  gpu::StreamResources stream(0, gpu::StreamRole::compute, 0);
  const std::size_t bytes = 1 << 16;
  weft::Block block = alloc->allocate(bytes, stream.handles().stream);
  weft::Block source = pinned->allocate(bytes);
  std::memset(source.ptr, 0x5a, bytes);
  Latch latch;
  std::atomic<bool> ran{false};
  // Work on the block's own stream, held back by a latch: the block may be
  // freed (cached for this stream) before it runs, as a GPU op's memory is.
  gpu::launch_host_func(stream.handles().stream, [&latch, &ran] {
    latch.wait();
    ran = true;
  });
  gpu::memcpy_async(block.ptr, source.ptr, bytes, gpu::CopyKind::host_to_device, stream.handles().stream);
  alloc->free(block);
  std::thread opener([&latch] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    latch.release();
  });
  alloc->release_cached();  // gives the block back to the system: only after the copy
  CHECK(ran.load());
  opener.join();
  stream.synchronize();
  pinned->free(source);
}

TEST_CASE("gpu backend - device memory has a capacity and running out is an OutOfMemory naming it" *
          doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  const gpu::DeviceProperties p = gpu::properties(0);
  auto alloc = weft::make_caching_allocator(Device::gpu(0));
  try {
    (void)alloc->allocate(p.memory_bytes + (std::size_t{1} << 30));
    FAIL("an allocation beyond the device's capacity succeeded");
  } catch (const weft::OutOfMemory& e) {
    CHECK(e.device() == Device::gpu(0));
    CHECK(e.requested() == p.memory_bytes + (std::size_t{1} << 30));
    CHECK(e.free_bytes() <= p.memory_bytes);
    CHECK(std::string(e.what()).find("out of memory on gpu(0)") != std::string::npos);
  }
  // Still usable.
  weft::Block b = alloc->allocate(4096);
  CHECK(b.ptr != nullptr);
  alloc->free(b);
}
