// pipecheck's tensor-memory meter (reference/memory_meter.h) as a C library, so that a trainer under
// test that runs in Python can measure its peak tensor bytes exactly as pipecheck measures its own
// trainer: `ctypes.CDLL(os.environ["PIPECHECK_METER"])` after `import torch` (the library links the
// same LibTorch), then start once on the training thread and read or reset the peak around steps
// (trainers/protocol.py's Meter).
#include <cstdint>

#include "reference/memory_meter.h"

extern "C" {

void pipecheck_meter_start() { pipecheck::reference::StartMemoryMeter(); }
int64_t pipecheck_meter_live_bytes() { return pipecheck::reference::LiveTensorBytes(); }
int64_t pipecheck_meter_peak_bytes() { return pipecheck::reference::PeakTensorBytes(); }
void pipecheck_meter_reset_peak() { pipecheck::reference::ResetPeakTensorBytes(); }

}  // extern "C"
