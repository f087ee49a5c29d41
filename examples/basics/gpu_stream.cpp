// A GPU op: its body enqueues work on the stream the engine gives it
// (ctx.gpu->stream) and returns; the op counts as done when that work is
// enqueued, and ops depending on it wait by events, never by blocking the
// host. Runs on a real GPU, or on simulated ones: WEFT_GPU_BACKEND=sim.
#include <weft/engine.h>
#include <weft/gpu_streams.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  auto engine = weft::Engine::create();
  const weft::Device gpu = weft::Device::gpu(0);
  if (weft::gpu::device_count() == 0)
    return std::printf("no GPU answers (WEFT_GPU_BACKEND=sim simulates two)\n"), 0;
  const std::size_t n = 1 << 20, bytes = n * sizeof(float);
  // Pinned host memory: copies to and from it are asynchronous.
  weft::Allocator& pinned = engine->allocator(weft::Device::cpu_pinned(0));
  weft::Block in = pinned.allocate(bytes), out = pinned.allocate(bytes);
  weft::SharedVar vin(*engine, "in"), vout(*engine, "out");

  engine->push([&] { std::fill_n(static_cast<float*>(in.ptr), n, 1.5f); }, {}, {vin}, {.name = "fill"});
  engine->push(
      [&](weft::RunContext& ctx) {
        weft::gpu::Stream* s = ctx.gpu->stream;
        weft::Allocator& mem = ctx.engine->allocator(ctx.device);
        weft::Block a = mem.allocate(bytes, s), b = mem.allocate(bytes, s);  // ordered on s
        weft::gpu::memcpy_async(a.ptr, in.ptr, bytes, weft::gpu::CopyKind::host_to_device, s);
        // Your kernel goes here, on the same stream, e.g. with CUDA:
        //   scale<<<grid, block, 0, (cudaStream_t)weft::gpu::native_handle(s)>>>(b.ptr, a.ptr, n);
        weft::gpu::memcpy_async(b.ptr, a.ptr, bytes, weft::gpu::CopyKind::device_to_device, s);
        weft::gpu::memcpy_async(out.ptr, b.ptr, bytes, weft::gpu::CopyKind::device_to_host, s);
        mem.free(a);  // stream-ordered: reused only by work after this on s
        mem.free(b);
      },
      gpu, {vin}, {vout}, {.name = "round trip on " + gpu.str()});
  double sum = 0;
  engine->push([&] { for (std::size_t i = 0; i < n; ++i) sum += static_cast<float*>(out.ptr)[i]; }, {vout}, {},
               {.name = "sum on the host"});  // waits for the stream's event, then runs on cpu(0)
  engine->wait_all();
  std::printf("%s: sum %.1f (expected %.1f)\n", weft::gpu::describe(0).c_str(), sum, 1.5 * n);
  pinned.free(in);
  pinned.free(out);
  return sum == 1.5 * static_cast<double>(n) ? 0 : 1;
}
