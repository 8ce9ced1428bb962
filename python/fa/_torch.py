"""PyTorch training support: gradients through fa's backward, and ops torch.compile can trace.

Imported the first time a torch tensor needs it (autograd, torch.compile), never by `import fa`.

Two ways in, one implementation (_fwd_impl, _bwd_impl):
- AttnFunction, a torch.autograd.Function: what eager calls take (a custom op's dispatch costs
  about 75 us more per forward and as much per backward: 94 against 17 us, PyTorch 2.15 on a
  2-core development machine, daemon calls stubbed out), and the only way on PyTorch
  without torch.library.custom_op (< 2.4), where torch.compile breaks the graph around it;
- PyTorch >= 2.4: the custom ops fa::attn_fwd and fa::attn_bwd (torch.library.custom_op), each
  with a fake (shapes only) so torch.compile traces them without graph breaks, and
  register_autograd connecting attn_fwd's gradient to attn_bwd: what calls take while
  torch.compile traces them. `route` chooses otherwise (tests run both ways eagerly).

The forward saves q, k, v, out and lse (the daemon computes lse whenever a gradient may be
needed); lse is returned but not differentiable, as in FlashAttention. The op arguments carry
no Python objects: the client is its small integer (0: the default client) and the stream a code
(STREAM_AUTO, STREAM_SYNC, STREAM_CURRENT, or a CUstream handle).
"""
from typing import Tuple

import torch

from . import _attn, _bwd, _client
from ._errors import usage

STREAM_SYNC = -1     # synchronous mode: wait for the producer, return when done
STREAM_CURRENT = -2  # fa's asynchronous mode on PyTorch's current stream
STREAM_AUTO = -3     # the default: CUDA tensors asynchronously on PyTorch's current stream
                     # while the daemon serves that (as every PyTorch op is ordered), else
                     # synchronous (CPU tensors, a refusing daemon, CUDA graph capture)

_WINDOW_DEFAULTS = (-1, -1, 0.0)  # window_left, window_right, softcap: the last, optional


def _with_window_defaults(inputs):
    """The forward's 14 arguments from the 11 to 14 a caller passed (the window arguments
    came last and are optional, so calls written for the older signature still work)."""
    n = len(inputs)
    return tuple(inputs) + _WINDOW_DEFAULTS[n - 11:] if n < 14 else tuple(inputs)


HAVE_CUSTOM_OP = (hasattr(torch.library, "custom_op") and hasattr(torch.library,
                                                                  "register_autograd"))
# Which way in calls take: "auto" (the custom ops while torch.compile traces, AttnFunction
# otherwise), "op" (the custom ops always) or "function" (AttnFunction always).
route = "auto"

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
if _is_compiling is None:  # PyTorch < 2.3
    try:
        from torch._dynamo import is_compiling as _is_compiling
    except ImportError:
        def _is_compiling():
            return False


def client_id(client):
    return 0 if client is None else client._op_id


def _client_of(cid):
    if cid == 0:
        return None
    c = _client._by_op_id.get(cid)
    if c is None:
        raise usage("FA_ECLOSED", "the fa.Client this attention was called with is gone "
                    "(closed and collected before the backward ran)")
    return c


def stream_code(stream):
    if stream is None:
        return STREAM_AUTO
    if isinstance(stream, str):
        if stream == "sync":
            return STREAM_SYNC
        if stream != "current":
            raise usage("FA_EINVAL", "stream=%r; None, 'current', 'sync', a torch.cuda.Stream "
                        "or a CUstream handle" % stream)
        return STREAM_CURRENT
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    return int(stream)


def _stream_of(code):
    return {STREAM_SYNC: None, STREAM_CURRENT: "current", STREAM_AUTO: "auto"}.get(code, code)


def _lse_empty(q, bhsd, want_lse):
    if not want_lse:
        return q.new_empty((0,), dtype=torch.float32)
    B, H, S = (q.shape[0], q.shape[1], q.shape[2]) if bhsd else (q.shape[0], q.shape[2],
                                                                  q.shape[1])
    return q.new_empty((B, H, S), dtype=torch.float32)


def _fwd_impl(q, k, v, bhsd, mask, scale, precision, want_lse, client, stream, wl=-1, wr=-1,
              softcap=0.0):
    # Outputs allocated exactly as the fakes allocate them (torch.compile relies on it).
    out = torch.empty_like(q)
    lse = _lse_empty(q, bhsd, want_lse)
    _attn.forward(q, k, v, bhsd=bhsd, mask=mask, scale=scale, want_lse=want_lse, out=out,
                  lse_out=lse if want_lse else None, client=_client_of(client),
                  precision=precision, gqa=True, stream=_stream_of(stream), window=(wl, wr),
                  softcap=softcap)
    return out, lse


def _bwd_impl(dout, q, k, v, out, lse, bhsd, mask, scale, precision, deterministic, client,
              stream, wl=-1, wr=-1, softcap=0.0):
    if lse.dim() != 3:
        raise usage("FA_EINVAL", "the forward ran without lse (want_lse=False), so there is "
                    "no gradient: " + _bwd.MISSING_LSE)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _bwd.backward(q, k, v, out, dout, lse, bhsd=bhsd, mask=mask, scale=scale,
                  deterministic=deterministic, dq=dq, dk=dk, dv=dv, client=_client_of(client),
                  precision=precision, gqa=True, stream=_stream_of(stream), window=(wl, wr),
                  softcap=softcap)
    return dq, dk, dv


def grad_for_fa(g):
    """The upstream gradient as fa takes it: any strides with the head dim contiguous. Only a
    gradient whose head dim is not contiguous is copied (an expanded one, as `o.sum()` gives,
    has stride 0 there); a transposed or sliced one is passed as it is."""
    return g if g.stride(-1) == 1 else g.contiguous()


if HAVE_CUSTOM_OP:
    @torch.library.custom_op("fa::attn_fwd", mutates_args=())
    def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bhsd: bool, mask: int,
                 scale: float, precision: int, want_lse: bool, deterministic: bool,
                 client: int, stream: int, window_left: int = -1, window_right: int = -1,
                 softcap: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """fa's forward: (out like q, lse fp32 [B, Hq, Sq], or empty [0] when not want_lse).
        bhsd: the layout of q, k, v; mask: fa.MASK_*; scale 0: 1/sqrt(D); deterministic: for
        the backward this op's gradient runs; client: 0 or a Client's _op_id; stream: a code
        of stream_code(); window_left/right: FlashAttention's window_size (-1, -1: none);
        softcap: 0 off."""
        return _fwd_impl(q, k, v, bhsd, mask, scale, precision, want_lse, client, stream,
                         window_left, window_right, softcap)

    @attn_fwd.register_fake
    def _attn_fwd_fake(q, k, v, bhsd, mask, scale, precision, want_lse, deterministic, client,
                       stream, window_left=-1, window_right=-1, softcap=0.0):
        return torch.empty_like(q), _lse_empty(q, bhsd, want_lse)

    @torch.library.custom_op("fa::attn_bwd", mutates_args=())
    def attn_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, bhsd: bool, mask: int, scale: float,
                 precision: int, deterministic: bool, client: int, stream: int,
                 window_left: int = -1, window_right: int = -1,
                 softcap: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fa's backward: (dq, dk, dv) like q, k, v, for attn_fwd's inputs, out and lse and the
        upstream gradient dout (head dim contiguous); window and softcap as attn_fwd had."""
        return _bwd_impl(dout, q, k, v, out, lse, bhsd, mask, scale, precision, deterministic,
                         client, stream, window_left, window_right, softcap)

    @attn_bwd.register_fake
    def _attn_bwd_fake(dout, q, k, v, out, lse, bhsd, mask, scale, precision, deterministic,
                       client, stream, window_left=-1, window_right=-1, softcap=0.0):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def _setup_context(ctx, inputs, output):
        ctx.n_inputs = len(inputs)
        (q, k, v, bhsd, mask, scale, precision, _want, deterministic, client, stream,
         wl, wr, softcap) = _with_window_defaults(inputs)
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params = (bhsd, mask, scale, precision, deterministic, client, stream, wl, wr,
                      softcap)
        ctx.mark_non_differentiable(lse)

    def _attn_fwd_backward(ctx, g, _g_lse):
        if g is None:
            return (None,) * ctx.n_inputs
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.fa.attn_bwd(grad_for_fa(g), q, k, v, out, lse, *ctx.params)
        return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)

    attn_fwd.register_autograd(_attn_fwd_backward, setup_context=_setup_context)


class AttnFunction(torch.autograd.Function):
    """fa's forward and backward as a torch.autograd.Function (the way in on PyTorch without
    torch.library.custom_op; same arguments as the fa::attn_fwd op)."""

    @staticmethod
    def forward(ctx, q, k, v, bhsd, mask, scale, precision, want_lse, deterministic, client,
                stream, *window):
        ctx.n_inputs = 11 + len(window)
        wl, wr, softcap = _with_window_defaults((None,) * 11 + window)[11:]
        out, lse = _fwd_impl(q, k, v, bhsd, mask, scale, precision, want_lse, client, stream,
                             wl, wr, softcap)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params = (bhsd, mask, scale, precision, deterministic, client, stream, wl, wr,
                      softcap)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable  # fa has no double backward: refuse it
    def backward(ctx, g, _g_lse):
        if g is None:
            return (None,) * ctx.n_inputs
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _bwd_impl(grad_for_fa(g), q, k, v, out, lse, *ctx.params)
        return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)


def attention(q, k, v, *, bhsd, mask, scale, precision, want_lse, deterministic, client,
              stream, window=(-1, -1), softcap=0.0):
    """(out, lse) through autograd (lse computed when want_lse or when a gradient may be
    needed; an empty tensor otherwise). deterministic: FA_BWD_DETERMINISTIC for the backward,
    also set by torch.use_deterministic_algorithms(True). window (left, right) and softcap go
    to the forward and, saved, to its backward."""
    need_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                             v.requires_grad)
    args = (q, k, v, bool(bhsd), int(mask), float(scale) if scale else 0.0, int(precision),
            bool(want_lse or need_grad),
            bool(deterministic or torch.are_deterministic_algorithms_enabled()),
            client_id(client), stream_code(stream), int(window[0]), int(window[1]),
            float(softcap))
    if HAVE_CUSTOM_OP and route != "function" and (route == "op" or _is_compiling()):
        return torch.ops.fa.attn_fwd(*args)
    return AttnFunction.apply(*args)
