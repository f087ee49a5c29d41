// Linked into the multi-process tests in sanitized builds only: Open MPI
// unloads its plugins (dlclose) in MPI_Finalize, and LeakSanitizer, which
// runs after that, can then no longer name the plugins behind Open MPI's
// deliberate allocations, so tests/lsan-mpi.supp could not suppress them
// (and ThreadSanitizer refuses suppressions naming an unloaded library). A
// dlclose in the executable takes precedence over libc's for every library:
// plugins stay mapped until the process ends, and every leak report names
// its module.
extern "C" int dlclose(void*) { return 0; }
