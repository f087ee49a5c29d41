#include "weft/gpu_timing.h"

#include "runtime.h"

namespace weft::gpu {

using detail::runtime;

TimingEvent::TimingEvent(int device) : event_(runtime().create_event(device, /*timing=*/true)), device_(device) {}
TimingEvent::~TimingEvent() { runtime().destroy_event(event_); }
void TimingEvent::record(Stream* stream) { runtime().record_event(event_, stream); }
bool TimingEvent::done() const { return runtime().event_done(event_); }
void TimingEvent::synchronize() const { runtime().event_synchronize(event_); }
float TimingEvent::ms_since(const TimingEvent& earlier) const { return runtime().elapsed_ms(earlier.event_, event_); }

}  // namespace weft::gpu
