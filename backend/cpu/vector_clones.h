// CASTOR_VECTOR_CLONES: builds a hot float loop for AVX-512, AVX2 and the
// baseline x86-64 ISA with GCC's target_clones; the loader picks the best
// clone the CPU runs. castor builds without -march flags (one binary for
// every x86-64 machine), so a plain loop gets the baseline's two float64
// or four float32 lanes.
//
// Every castor target compiles with -ffp-contract=off (no FMA in the wider
// clones either) and -fno-math-errno (sqrt vectorises), so all clones of a
// function compute the same bits: vectorising a loop must not reorder its
// float adds (write the independent partial sums out, as LaneSums does).
// Helpers a clone calls must be inlined into it to be vectorised too
// (small templates and [[gnu::always_inline]] functions are).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CASTOR_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CASTOR_VECTOR_CLONES
#endif
