// An async op: its body starts the work and returns; the op completes when its
// Completion is called, here by an I/O thread's callback. Ops reading the
// variable wait for that call, not for the body.
#include <weft/engine.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

// A stand-in for an asynchronous I/O API: calls `on_done(data)` from its own
// thread once the "read" finished.
template <class Callback>
std::thread read_file_async(std::string path, Callback on_done) {
  return std::thread([path = std::move(path), on_done = std::move(on_done)]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the disk
    on_done("contents of " + path);
  });
}

int main() {
  auto engine = weft::Engine::create();
  weft::SharedVar file(*engine, "file"), length(*engine, "length");
  std::string data;
  std::size_t n = 0;
  std::thread io;

  engine->push_async(
      [&](weft::Completion done) {
        io = read_file_async("train.bin", [&data, done](std::string contents) {
          data = std::move(contents);
          done();  // the op is complete: readers of `file` may run
        });
      },
      {}, {file}, {.name = "read train.bin"});
  engine->push([&] { n = data.size(); }, {file}, {length}, {.name = "measure"});

  std::printf("pushed both ops; the read is in flight\n");
  engine->wait_to_read(length);
  std::printf("read %zu bytes: \"%s\"\n", n, data.c_str());
  io.join();
  return n == data.size() && n > 0 ? 0 : 1;
}
