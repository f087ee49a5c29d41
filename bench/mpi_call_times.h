// The bench's side of weft-mpi-call-times (mpi_call_times.cpp): the
// MPI_Pcontrol levels that open and close a window. MPI leaves levels other
// than 0, 1 and 2 to the profiling library (MPI 4.1 section 15.2.4), so a
// program that calls MPI_Pcontrol(1) to switch profiling on opens nothing.
//
//   MPI_Pcontrol(weft_bench::kCallTimesOpen, "name");  // every MPI_Allreduce from here on counts
//   ...
//   MPI_Pcontrol(weft_bench::kCallTimesClose);
//
// Without the interposer both calls do nothing.
#pragma once

namespace weft_bench {
inline constexpr int kCallTimesOpen = 1701;   // followed by the window's name (const char*)
inline constexpr int kCallTimesClose = 1702;
}  // namespace weft_bench
