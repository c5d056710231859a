// Transparent huge pages for the large CPU buffers a decode step streams through every step (ring
// and KV caches).
//
// With 4 KiB pages a step that reads a 200 MB cache walks the page tables for every 4 KiB it
// touches (the TLB covers about 12 MB), and each walk delays the prefetches of the next item's
// ring; on 2 MiB pages the same cache needs about a hundred entries. Linux backs an anonymous
// mapping with huge pages where the system's setting
// (/sys/kernel/mm/transparent_hugepage/enabled) is "always", or "madvise" and the range was
// advised; with "never", or without a free 2 MiB page, it uses 4 KiB pages and nothing else
// changes. docs/benchmarks.md, "The decode item's memory", has the measured effect.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

namespace krause {

// Advises the whole 2 MiB pages inside [p, p + bytes) for huge pages (madvise MADV_HUGEPAGE).
// Pages already written keep their size. A hint: returns whether the kernel accepted it (false
// where the range holds no whole 2 MiB page, or the kernel lacks transparent huge pages).
bool AdviseHugePages(void* p, size_t bytes);

// at::zeros(sizes, options); a CPU tensor's memory is advised (AdviseHugePages) before the zeros
// are written, so that its pages are huge where the system allows.
at::Tensor ZerosOnHugePages(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace krause
