// Column blocks of a wide tensor (backend.h's ColumnBlocks): a LoRA adapter's output added into
// its part of a packed output, and that part's gradient read back out.
#include "kernels.h"

namespace jumbo::cpu {
namespace {

// Checks the shapes; returns the rows and the narrow's and wide's widths.
struct Dims {
  int64_t rows, narrow, wide;
};
Dims column_dims(Tensor narrow, Tensor wide, const ColumnBlocks& at, const char* what) {
  const Dims d{narrow.dim(-1) > 0 ? narrow.numel() / narrow.dim(-1) : 0, narrow.dim(-1),
               wide.dim(-1)};
  const int64_t blocks = at.block > 0 ? d.narrow / at.block : 0;
  expect(narrow.dtype == wide.dtype && at.block > 0 && d.narrow % at.block == 0 &&
             wide.numel() == d.rows * d.wide && at.first >= 0 &&
             at.first + (blocks - 1) * at.period + at.block <= d.wide &&
             (blocks == 1 || at.period >= at.block),
         what);
  return d;
}

}  // namespace

void add_to_column_blocks(Tensor wide, Tensor narrow, const ColumnBlocks& at) {
  const Dims d = column_dims(narrow, wide, at, "add_to_column_blocks: narrow [N, k block] in wide [N, W]");
  dispatch_float(wide.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* pn = narrow.as<T>();
    T* pw = wide.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < d.rows; ++r) {
      for (int64_t c = 0; c < d.narrow; ++c) {
        T* w = pw + r * d.wide + at.first + (c / at.block) * at.period + c % at.block;
        store(w, 0, load(w, 0) + load(pn + r * d.narrow, c));
      }
    }
  });
}

void copy_from_column_blocks(Tensor narrow, Tensor wide, const ColumnBlocks& at) {
  const Dims d = column_dims(narrow, wide, at, "copy_from_column_blocks: narrow [N, k block] of wide [N, W]");
  dispatch_float(wide.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* pn = narrow.as<T>();
    const T* pw = wide.as<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < d.rows; ++r) {
      for (int64_t c = 0; c < d.narrow; ++c) {
        pn[r * d.narrow + c] = pw[r * d.wide + at.first + (c / at.block) * at.period + c % at.block];
      }
    }
  });
}

}  // namespace jumbo::cpu
