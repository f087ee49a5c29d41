#include "weft/gpu_timing.h"

#include "backend.h"

namespace weft::gpu {

using detail::active_backend;

TimingEvent::TimingEvent(int device)
    : event_(active_backend().create_event(device, /*timing=*/true)), device_(device) {}
TimingEvent::~TimingEvent() { active_backend().destroy_event(event_); }
void TimingEvent::record(Stream* stream) { active_backend().record_event(event_, stream); }
bool TimingEvent::done() const { return active_backend().event_done(event_); }
void TimingEvent::synchronize() const { active_backend().event_synchronize(event_); }
double TimingEvent::modeled_time() const { return active_backend().event_modeled_time(event_); }
float TimingEvent::ms_since(const TimingEvent& earlier) const {
  return active_backend().elapsed_ms(earlier.event_, event_);
}

}  // namespace weft::gpu
