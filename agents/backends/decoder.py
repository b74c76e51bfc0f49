"""The model side of the decode engine: a Llama-family causal LM (llama, mistral, qwen2, qwen3)
run from its weights over a packed batch (the new tokens of many sequences as the rows of one
matrix) against the engine's slot cache.

Batch invariance by construction: the arithmetic of a row depends only on its own sequence.

* Every packed batch and logits batch has a multiple of :data:`ROW_ALIGN` rows (padded), so
  that element-wise kernels never compute a real row in their scalar tail loop (whose
  transcendental functions round differently from the vector ones).
* Linear layers are one matrix product over all rows when this machine's BLAS computes a row
  the same whatever the (aligned) number of rows and the row's place among them
  (:func:`rows_independent` checks each kind of layer once per model), and over fixed tiles of
  :data:`TILE_ROWS` rows otherwise. ``quantize="int8"`` layers quantise each row on its own and
  accumulate in int32, which is exact whatever the blocking.
* On CPU, float layers may also keep their weights packed once for MKL's GEMM
  (:func:`mkl_packed`): a product of at most :data:`ROW_ALIGN` rows (every decode step of a
  small batch) then skips packing the weights again. Whether that pays depends on the machine
  (about 1.45x faster at 16 rows on one, 1.2-1.4x slower on another), so each kind of layer keeps
  its packed copies only where they were faster when the decoder was built
  (:meth:`Decoder.unpack_where_slower`). The packed product gives the same bits as the plain
  one; a layer is packed only after a probe shows that, and the packed copy serves only at the
  thread count of the probe. The copy doubles the memory of the float32 weights (about 540 MB
  more for SmolLM2-135M).
* Normalisation, rotary embedding and activations are row-wise; attention runs one sequence at
  a time (:mod:`.attention`; decode attention as a compiled loop over the sequences where it
  gives the same bits).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from .attention import PrefillPlan, decode_attention_for, prefill_attention

logger = logging.getLogger(__name__)

#: The model types whose layers :class:`Decoder` reproduces.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: Every packed batch and every logits batch has a multiple of this many rows.
ROW_ALIGN = 16
#: The row tile of linear layers on a BLAS whose rows depend on the number of rows.
TILE_ROWS = 16
#: Row counts at which :func:`rows_independent` compares a row's result.
PROBE_ROWS = (ROW_ALIGN, 2 * ROW_ALIGN, 3 * ROW_ALIGN, 64, 112, 304)
#: Timed passes over a kind of layer, packed and plain in turn, in
#: :meth:`Decoder.unpack_where_slower` (the best of each counts).
PACK_TIMING_PASSES = 3


class Linear:
    """``x @ weight.T + bias``: in the weights' dtype, or with ``quantize=True`` in int8
    (weights per output channel, each activation row on its own scale, int32 accumulation).
    ``tile`` (rows): compute in fixed tiles of that many rows instead of one product."""

    def __init__(self, weight: Any, bias: Any, quantize: bool, tile: int | None = None) -> None:
        import torch

        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.tile = tile
        self.quantized = quantize
        self.packed = None
        if quantize:
            scale = weight.float().abs().amax(1).clamp(min=1e-12) / 127
            self.weight = torch.round(weight.float() / scale[:, None]).to(torch.int8).T.contiguous()
            self.scale = scale[None, :]
        else:
            self.weight = weight
            self.packed = mkl_packed(weight, bias)
            #: MKL keeps the threading plan of the packing: the packed product serves only at
            #: the thread count it was probed at
            self.packed_threads = torch.get_num_threads()

    def __call__(self, x: Any) -> Any:
        """The layer applied to the rows of ``x`` (``[rows, in_features]``)."""
        import torch

        if self.tile is None:
            return self._product(x)
        rows = x.shape[0]
        padded = x.new_zeros(-(-rows // self.tile) * self.tile, x.shape[1])
        padded[:rows] = x
        tiles = [self._product(part) for part in padded.split(self.tile)]
        return torch.cat(tiles)[:rows]

    def _product(self, x: Any) -> Any:
        import torch
        import torch.nn.functional as F

        if not self.quantized:
            if (
                self.packed is not None
                and x.shape[0] == ROW_ALIGN
                and torch.get_num_threads() == self.packed_threads
            ):
                return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, ROW_ALIGN)
            return F.linear(x, self.weight, self.bias)
        scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
        quantized = torch.round(x / scale).to(torch.int8)
        out = torch._int_mm(quantized, self.weight).to(x.dtype) * (scale * self.scale)
        return out if self.bias is None else out + self.bias


def mkl_packed(weight: Any, bias: Any) -> Any:
    """``weight`` packed for MKL's GEMM at :data:`ROW_ALIGN` rows, or ``None`` where that does
    not apply (not a float32 CPU weight, a torch build without MKL) or would change a result:
    the packed product of random rows must equal ``F.linear`` bit for bit."""
    import torch
    import torch.nn.functional as F

    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    try:
        mkl = torch.ops.mkl
        with torch.no_grad():
            packed = mkl._mkl_reorder_linear_weight(weight, ROW_ALIGN)
            generator = torch.Generator().manual_seed(0)
            rows = torch.randn(ROW_ALIGN, weight.shape[1], generator=generator)
            same = torch.equal(mkl._mkl_linear(rows, packed, weight, bias, ROW_ALIGN),
                               F.linear(rows, weight, bias))  # fmt: skip
    except (AttributeError, RuntimeError):
        return None
    return packed if same else None


def aligned(rows: int) -> int:
    """``rows`` rounded up to a multiple of :data:`ROW_ALIGN`."""
    return -(-rows // ROW_ALIGN) * ROW_ALIGN


def rows_independent(linear: Linear) -> bool:
    """Whether ``linear`` gives a row the same bits whatever the number of rows (from
    :data:`PROBE_ROWS`, multiples of :data:`ROW_ALIGN`) and the row's place among them."""
    import torch

    generator = torch.Generator().manual_seed(0)
    weight = linear.weight
    rows = torch.randn(max(PROBE_ROWS) + 1, linear.in_features, generator=generator)
    rows = rows.to(device=weight.device, dtype=weight.dtype if weight.is_floating_point() else None)
    reference = linear(rows[:ROW_ALIGN])[0]
    for count in PROBE_ROWS:
        if not torch.equal(linear(rows[:count])[0], reference):
            return False
        if not torch.equal(linear(torch.cat([rows[1:count], rows[:1]]))[-1], reference):
            return False
    return True


@dataclass
class Layer:
    """The weights of one decoder layer (query/key/value and gate/up projections fused)."""

    input_norm: Any
    qkv: Linear
    out: Linear
    post_norm: Any
    gate_up: Linear
    down: Linear
    query_norm: Any = None
    key_norm: Any = None


@dataclass
class Step:
    """One forward pass: the packed rows (decode rows first, then each prefill's rows, then
    padding to a multiple of :data:`ROW_ALIGN`) and which rows attend to what."""

    tokens: Any  #: token ids ``[rows]``
    positions: Any  #: positions ``[rows]``
    slots: Any  #: the cache slot of each real row (``[real rows]``)
    decodes: list[tuple[int, int]]  #: ``(slot, length)`` of decode rows ``0 .. n-1``
    prefills: list[PrefillPlan]
    logit_rows: Any  #: the rows whose next-token logits are wanted


def _linear_weight(module: Any) -> tuple[Any, Any]:
    """``(weight, bias)`` of a linear layer as it computes, LoRA adapters (peft) included."""
    if not hasattr(module, "base_layer"):
        return module.weight.detach(), module.bias
    base = module.get_base_layer()
    weight = base.weight.detach()
    if not module.merged and not module.disable_adapters:
        for name in module.active_adapters:
            if name in module.lora_A:
                weight = weight + module.get_delta_weight(name).detach()
    return weight, base.bias


def _fused(modules: list[Any], quantize: bool) -> Linear:
    import torch

    weights, biases = zip(*(_linear_weight(m) for m in modules))
    bias = None if all(b is None for b in biases) else torch.cat([
        b.detach() if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)
    ])  # fmt: skip
    weight = torch.cat(weights) if len(weights) > 1 else weights[0]
    return Linear(weight, bias, quantize)


class Decoder:
    """A Llama-family causal LM's forward pass over packed rows (see the module docstring).

    The weights are read when the decoder is built (fused copies for the projections); build a
    new one after the model's weights change. ``quantize``: ``None`` or ``"int8"`` (CPU).
    ``compiled_attention``: run decode attention as the compiled loop where it builds and gives
    the Python loop's bits (:func:`.attention.decode_attention_for`); it changes no result.

    Raises:
        ValueError: a model type or setting this decoder does not reproduce.
    """

    def __init__(
        self, model: Any, quantize: str | None = None, compiled_attention: bool = True
    ) -> None:
        import torch

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        kind = getattr(config, "model_type", None)
        if kind not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"the transformers backend runs {', '.join(SUPPORTED_MODEL_TYPES)} models; "
                f"this is {kind!r} (serve it with vLLM or another OpenAI-compatible server)"
            )
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported activation {config.hidden_act!r}")
        window = getattr(config, "sliding_window", None)
        if window is not None and getattr(config, "use_sliding_window", True):
            raise ValueError("sliding-window attention is not supported")
        if quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
        self.device = base.lm_head.weight.device
        if quantize and self.device.type != "cpu":
            raise ValueError("quantize='int8' runs on CPU only")
        inner = base.model
        attention = inner.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.scale = float(getattr(attention, "scaling", self.head_dim**-0.5))
        self.eps = config.rms_norm_eps
        self.layer_count = len(inner.layers)
        self.max_positions = config.max_position_embeddings
        self.dtype = base.lm_head.weight.dtype
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        quant = quantize == "int8"
        self.lm_head = Linear(*_linear_weight(base.lm_head), quant)
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(Layer(
                input_norm=layer.input_layernorm.weight.detach(),
                qkv=_fused([attn.q_proj, attn.k_proj, attn.v_proj], quant),
                out=_fused([attn.o_proj], quant),
                post_norm=layer.post_attention_layernorm.weight.detach(),
                gate_up=_fused([mlp.gate_proj, mlp.up_proj], quant),
                down=_fused([mlp.down_proj], quant),
                query_norm=_norm_weight(getattr(attn, "q_norm", None)),
                key_norm=_norm_weight(getattr(attn, "k_norm", None)),
            ))  # fmt: skip
        positions = torch.arange(self.max_positions, device=self.device)[None]
        with torch.no_grad():
            cos, sin = inner.rotary_emb(self.embed[:1], positions)
        self.cos, self.sin = cos[0], sin[0]
        if not quant:
            self._tile_if_rows_depend_on_batch()
            self.unpack_where_slower()
        self.decode_attention = decode_attention_for(
            self.device, self.dtype, self.kv_heads, self.group, self.head_dim, compiled_attention
        )

    @property
    def kv_bytes_per_position(self) -> int:
        """The bytes one position of one sequence takes in a KV cache (keys and values, every
        layer)."""
        return 2 * self.layer_count * self.kv_heads * self.head_dim * self.embed.element_size()

    def linear_kinds(self) -> dict[str, list[Linear]]:
        """The linear layers by kind: query/key/value, output, gate/up, down, LM head."""
        return {
            "qkv": [layer.qkv for layer in self.layers],
            "out": [layer.out for layer in self.layers],
            "gate_up": [layer.gate_up for layer in self.layers],
            "down": [layer.down for layer in self.layers],
            "lm_head": [self.lm_head],
        }

    def unpack_where_slower(self) -> None:
        """Time each kind of layer's products of :data:`ROW_ALIGN` rows over all its layers,
        packed and plain in turn (:data:`PACK_TIMING_PASSES` passes, the best of each), and drop
        the packed copies of the kinds where the plain product was faster. Results do not
        change (the packed product gives the plain one's bits); only time and memory do."""
        import torch

        generator = torch.Generator().manual_seed(0)
        plain = []
        for name, linears in self.linear_kinds().items():
            packed = [linear.packed for linear in linears]
            if any(copy is None for copy in packed):
                continue
            rows = torch.randn(ROW_ALIGN, linears[0].in_features, generator=generator)
            rows = rows.to(device=self.device, dtype=self.dtype)
            best = {True: float("inf"), False: float("inf")}
            with torch.no_grad():
                for _ in range(PACK_TIMING_PASSES):
                    for use_packed in best:
                        for linear, copy in zip(linears, packed):
                            linear.packed = copy if use_packed else None
                        start = time.perf_counter()
                        for linear in linears:
                            linear(rows)
                        best[use_packed] = min(best[use_packed], time.perf_counter() - start)
            keep = best[True] <= best[False]
            for linear, copy in zip(linears, packed):
                linear.packed = copy if keep else None
            if not keep:
                plain.append(f"{name} ({best[True] / best[False]:.2f}x the plain time)")
        if plain:
            logger.info(
                "packed weights were slower than the plain product here for %s: those layers "
                "run plain (same results)",
                ", ".join(plain),
            )

    def _tile_if_rows_depend_on_batch(self) -> None:
        """Probe each kind of linear layer (query/key/value, output, gate/up, down, LM head) on
        the first layer; the kinds whose rows depend on the batch (BLAS kernels choose their
        blocking by shape and thread count: here the down projection with two threads) run in
        fixed tiles, the others stay one product."""
        import torch

        kinds = self.linear_kinds()
        with torch.no_grad():
            tiled = [name for name, linears in kinds.items() if not rows_independent(linears[0])]
        if tiled:
            logger.info(
                "this BLAS computes a row of %s differently depending on the batch: those "
                "layers run in fixed tiles of %d rows to stay batch-invariant",
                ", ".join(tiled),
                TILE_ROWS,
            )
        for name in tiled:
            for linear in kinds[name]:
                linear.tile = TILE_ROWS

    def forward(self, step: Step, keys: Any, values: Any) -> Any:
        """Logits ``[len(step.logit_rows), vocab]`` of ``step``; writes the new rows' keys and
        values into ``keys`` / ``values`` (``[layers, slots, kv_heads, capacity, dim]``)."""
        import torch.nn.functional as F

        rows = step.tokens.shape[0]
        real = step.slots.shape[0]
        decoded = len(step.decodes)
        write_positions = step.positions[:real]
        cos = self.cos[step.positions].unsqueeze(1)
        sin = self.sin[step.positions].unsqueeze(1)
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        x = F.embedding(step.tokens, self.embed)
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(_rms_norm(x, layer.input_norm, self.eps))
            q = qkv[:, :q_width].view(rows, self.heads, self.head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(rows, self.kv_heads, self.head_dim)
            v = qkv[:, q_width + kv_width :].view(rows, self.kv_heads, self.head_dim)
            if layer.query_norm is not None:
                q = _rms_norm(q, layer.query_norm, self.eps)
                k = _rms_norm(k, layer.key_norm, self.eps)
            q = _rotate(q, cos, sin) * self.scale
            k = _rotate(k, cos, sin)
            layer_keys, layer_values = keys[index], values[index]
            layer_keys[step.slots, :, write_positions] = k[:real]
            layer_values[step.slots, :, write_positions] = v[:real]
            q = q.view(rows, self.kv_heads, self.group, self.head_dim)
            attended = q.new_zeros(q.shape)
            if decoded:
                attended[:decoded] = self.decode_attention(
                    q[:decoded], layer_keys, layer_values, step.decodes
                )
            for plan in step.prefills:
                span = slice(plan.row, plan.row + plan.count)
                attended[span] = prefill_attention(q[span], layer_keys, layer_values, plan)
            x = x + layer.out(attended.view(rows, q_width))
            gate_up = layer.gate_up(_rms_norm(x, layer.post_norm, self.eps))
            gate, up = gate_up.chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        wanted = step.logit_rows.shape[0]
        last = x.new_zeros(aligned(max(wanted, 1)), x.shape[1])
        last[:wanted] = x[step.logit_rows]
        return self.lm_head(_rms_norm(last, self.norm, self.eps))[:wanted]


def _norm_weight(module: Any) -> Any:
    return None if module is None else module.weight.detach()


def _rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """RMS normalisation over the last dimension, as Llama computes it (in float32)."""
    import torch

    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary position embedding (``x * cos + rotate_half(x) * sin``)."""
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
