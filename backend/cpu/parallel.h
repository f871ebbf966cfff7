// Data-parallel loops for CPU kernels on a persistent thread pool.
// ParallelFor splits [begin, end) into contiguous chunks of at least `grain`
// iterations, runs them on up to NumThreads() threads (the caller is one of
// them) and returns when all are done. Nested calls run serially.
#pragma once

#include <cstdint>
#include <functional>

namespace castor::cpu {

// Threads used by kernels: CASTOR_NUM_THREADS is not read; the CPU backend
// sets this from its options (default: hardware concurrency).
int NumThreads();
void SetNumThreads(int threads);

void ParallelFor(int64_t begin, int64_t end, int64_t grain,
                 const std::function<void(int64_t chunk_begin, int64_t chunk_end)>& fn);

// True on a thread running a chunk of a ParallelFor that was split across
// threads (a nested ParallelFor there runs serially); false where the body
// runs inline because there was a single chunk.
bool InsideParallelFor();

}  // namespace castor::cpu
