// The decode engine's per-sequence attention loop (agents/backends/attention.py,
// decode_attention) in C++: the same ATen operations on the same views, row after row, so every
// row gets the same bits as the Python loop, without Python's cost per operation and with the
// rows shared out over torch's intra-op threads (inside a parallel region each operation runs
// on one thread; each row is still computed by one thread, alone).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <vector>

namespace {

// queries [rows, kv_heads, group, head_dim]; keys, values [slots, kv_heads, capacity,
// head_dim]; row i attends to the first lengths[i] positions of slot slots[i].
torch::Tensor decode_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                               const torch::Tensor& values, const std::vector<int64_t>& slots,
                               const std::vector<int64_t>& lengths) {
  const int64_t rows = queries.size(0);
  TORCH_CHECK(static_cast<int64_t>(slots.size()) == rows &&
                  static_cast<int64_t>(lengths.size()) == rows,
              "decode_attention: one (slot, length) per query row");
  auto out = at::empty_like(queries);
  const auto key_columns = keys.transpose(2, 3);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const auto scores =
          at::bmm(queries[row], key_columns[slots[row]].narrow(2, 0, lengths[row]));
      const auto probs = at::softmax(scores, -1, at::kFloat).to(values.scalar_type());
      auto target = out[row];
      at::bmm_out(target, probs, values[slots[row]].narrow(1, 0, lengths[row]));
    }
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("decode_attention", &decode_attention,
             "decode attention, one sequence at a time (see attention.py)",
             pybind11::call_guard<pybind11::gil_scoped_release>());
}
