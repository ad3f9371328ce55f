"""Weight-only int8 for the decode matmuls: one scale per output channel (gpt-fast's int8).

Batch-1 decode reads every weight once per token for a few FLOPs each, so its speed is how fast
the weights can be read: int8 weights are a quarter of float32's bytes. Each ``nn.Linear`` of
the attention (q, k, v, o), the dense feed-forward (gate, up, down) and the output head becomes
an :class:`Int8Linear`: int8 codes ``q (out, in)`` and a float scale per output row, with

    w[o, i] ~= scale[o] * q[o, i],   scale[o] = max_i |w[o, i]| / 127,   q = round(w / scale)

Activations stay floating point (weight-only). The embedding, the norms and MoE experts stay float (an
MoE layer's experts are one batched weight, not ``nn.Linear``; :func:`quantize_int8` says which
it left).

The fast path is ``F.linear(x.bfloat16(), q.bfloat16()) * scale`` (float32 out): the form
Inductor's weight-only int8 pattern matches (it asks for bfloat16 activations and scales), so a
compiled decoder (:class:`~codex_lab.infer.fast_decode.FastDecoder`, ``compile=True`` or
``"aot"``) runs one kernel per matmul that reads the int8 codes; eagerly, the codes are converted
each call. Measured before choosing it (1 thread, the course's 2-core AMD EPYC, 2026-12-07, a
reference run on the other core): ATen's int8 kernel for this layout
(``torch._weight_int8pack_mm``) at one row took 620 us for a 1408 x 512 weight against 80 us for
float32 ``F.linear``, and stayed that slow compiled; float32 activations with the codes converted
in the graph were constant-folded back into a float32 weight (no int8 left); the bfloat16 form
compiled to a kernel 10-20% faster than the float32 one on the shipped model's shapes. The plain
path dequantises and calls float32 ``F.linear`` (:meth:`Int8Linear.reference`), and tests hold
the fast path to it by the bound bfloat16 rounding implies.

The bfloat16 activations cost fidelity, measured on the shipped model (24 held-out prompts, 32
greedy tokens each, 2026-12-07): the held-out loss is unchanged either way (int8 minus float32:
-0.0011 nats/token with bfloat16 activations, -0.0003 with float32 ones), but the share of
float32's greedy tokens kept falls from 0.86 [0.76, 0.96] to 0.68 [0.55, 0.82] (near-ties flip
sooner). So the activations are a stated choice: ``activations="bfloat16"`` (the default, the
fast kernel) or ``"float32"`` (``F.linear`` of the codes converted to float32: the faithful
copy, with no int8 kernel on a CPU: compiled, Inductor folds the conversion back into a float32
weight).

How close to float32 the quantised model is, is measured, not assumed:
:func:`codex_lab.evals.quantized.int8_fidelity` gives the held-out loss difference and the
share of greedy tokens kept.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codex_lab.nn.layers import SwiGLU
from codex_lab.nn.model import Attention, CodexModel

QMAX = 127  # symmetric int8 codes in [-127, 127] (-128 unused, so -q is always representable)
ACTIVATIONS = ("bfloat16", "float32")  # what the matmuls multiply the codes with (see the module docstring)


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-output-channel symmetric int8: weight (out, in) float -> codes (out, in) int8 and
    scales (out,) float32 (a zero row gets scale 1 and codes 0)."""
    w = weight.detach().float()
    # scale[o] = max_i |w[o, i]| / 127 (1 where the row is all zeros, so the division is defined)
    scale = w.abs().amax(dim=1) / QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    # q[o, i] = round(w[o, i] / scale[o]), clamped to the code range
    codes = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return codes, scale


class Int8Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` stored as int8 codes and one float scale per output row.

    Buffers: ``qweight`` (out, in) int8, ``scale`` (out,) float32, ``bias`` (out,) or None.
    Input (..., in) float -> output (..., out) in the input's dtype.
    """

    def __init__(self, linear: nn.Linear, activations: str = "bfloat16") -> None:
        super().__init__()
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations={activations!r}: choose one of {ACTIVATIONS}")
        self.activations = activations
        codes, scale = quantize_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", codes.to(linear.weight.device))
        self.register_buffer("scale", scale.to(linear.weight.device))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def dequantized(self) -> Tensor:
        """The weight the codes stand for, (out, in) float32: ``scale[o] * q[o, i]``."""
        return self.qweight.float() * self.scale[:, None]

    def reference(self, x: Tensor) -> Tensor:
        """The plain path: dequantise, then ``F.linear`` (what :meth:`forward` must equal)."""
        return F.linear(x, self.dequantized().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32:
            return self.reference(x)
        if self.activations == "float32":
            # y[..., o] = scale[o] * sum_i x[..., i] q[o, i] in float32 (the codes converted each call)
            y = F.linear(x, self.qweight.to(x.dtype)) * self.scale
            return y if self.bias is None else y + self.bias
        # y[..., o] = scale[o] * sum_i x[..., i] q[o, i], in bfloat16 with float32 sums: the form
        # Inductor's weight-only int8 pattern matches (bfloat16 activations and scales, int8 codes),
        # compiled into one kernel that reads the codes; float32 out
        xb = x.to(torch.bfloat16)
        y = (F.linear(xb, self.qweight.to(torch.bfloat16)) * self.scale.to(torch.bfloat16)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel, "
                f"{self.activations} activations")


def quantize_int8(model: CodexModel, *, head: bool = True, activations: str = "bfloat16") -> tuple[CodexModel, list[str]]:
    """A copy of ``model`` whose attention, dense feed-forward and (with ``head``) output-head
    matmuls are :class:`Int8Linear` (with ``activations``, see the module docstring); returns the
    copy and the names of the modules left float that hold matmul weights (MoE feed-forwards).
    ``model`` itself is not changed."""
    q = copy.deepcopy(model).eval()
    left: list[str] = []
    for name, module in list(q.named_modules()):
        if isinstance(module, Attention):
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(module, proj, Int8Linear(getattr(module, proj), activations))
        elif isinstance(module, SwiGLU):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                setattr(module, proj, Int8Linear(getattr(module, proj), activations))
        elif name.endswith(".ffn") and not isinstance(module, SwiGLU):
            left.append(name)
    if head:
        # an untied copy: the embedding keeps its float weight, the head gets int8 codes
        q.lm_head = Int8Linear(q.lm_head, activations)
    return q, left


def int8_weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer of ``model`` (int8 codes count one byte each)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total
