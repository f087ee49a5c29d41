// An async op: its body starts the work and returns; the op completes when its
// Completion is called, here by an I/O thread's callback. Ops reading the
// variable wait for that call, not for the body.
#include <weft/engine.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// A stand-in for an asynchronous I/O API: read() returns at once and calls
// `on_done(contents)` from its own thread when the "read" finished.
class AsyncReader {
 public:
  template <class Callback>
  void read(std::string path, Callback on_done) {
    std::lock_guard lock(mutex_);
    threads_.emplace_back([path = std::move(path), on_done = std::move(on_done)]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the disk
      on_done("contents of " + path);
    });
  }
  ~AsyncReader() {
    std::lock_guard lock(mutex_);
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

int main() {
  AsyncReader reader;  // outlives the engine: its callbacks complete the engine's ops
  auto engine = weft::Engine::create();
  weft::SharedVar file(*engine, "file"), length(*engine, "length");
  std::string data;
  std::size_t n = 0;

  engine->push_async(
      [&](weft::Completion done) {
        reader.read("train.bin", [&data, done](std::string contents) {
          data = std::move(contents);
          done();  // the op is complete: readers of `file` may run
        });
      },
      {}, {file}, {.name = "read train.bin"});
  engine->push([&] { n = data.size(); }, {file}, {length}, {.name = "measure"});

  std::printf("pushed both ops; the read is in flight\n");
  engine->wait_to_read(length);
  std::printf("read %zu bytes: \"%s\"\n", n, data.c_str());
  return n > 0 && n == data.size() ? 0 : 1;
}
