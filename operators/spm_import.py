"""Convert a SentencePiece ``.model`` file into a ``tokenizers`` tokenizer, without the sentencepiece package.

A ``.model`` file is a serialized ``ModelProto`` protobuf. We read the handful of fields that define
tokenization with a small wire-format parser (field numbers from sentencepiece_model.proto):

* ``pieces`` (1): repeated ``{piece (1): str, score (2): float, type (3): enum}``;
* ``trainer_spec`` (2): ``model_type`` (3: 1 = UNIGRAM, 2 = BPE), ``byte_fallback`` (35), ``unk_id`` (40);
* ``normalizer_spec`` (3): ``precompiled_charsmap`` (2), ``add_dummy_prefix`` (3),
``remove_extra_whitespaces``
  (4).

Unigram models map directly onto ``tokenizers.models.Unigram``. SentencePiece BPE stores no merge list, so the
merges are rebuilt from the vocabulary (every split of a piece into two pieces of the vocabulary, ranked by
the merged piece's score), the way Hugging Face's converters do. Tests compare the result with sentencepiece
itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

_UNIGRAM, _BPE = 1, 2
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _fields(buf: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) for each field of a protobuf message; values of wire type 2 stay
    bytes."""
    out: list[tuple[int, int, bytes | int]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, i = _varint(buf, i)
            out.append((num, wire, val))
        elif wire == 1:
            out.append((num, wire, buf[i:i + 8]))
            i += 8
        elif wire == 2:
            n, i = _varint(buf, i)
            out.append((num, wire, buf[i:i + n]))
            i += n
        elif wire == 5:
            out.append((num, wire, buf[i:i + 4]))
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {i}: not a SentencePiece model "
                             "file")
    return out


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated protobuf varint: the SentencePiece model file is damaged")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


@dataclass
class SpmModel:
    pieces: list[tuple[str, float, int]] = field(default_factory=list)
    model_type: int = _UNIGRAM
    byte_fallback: bool = False
    unk_id: int = 0
    charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True


def parse_model(data: bytes) -> SpmModel:
    m = SpmModel()
    for num, _, val in _fields(data):
        if num == 1 and isinstance(val, bytes):
            piece, score, kind = "", 0.0, _NORMAL
            for pn, _, pv in _fields(val):
                if pn == 1 and isinstance(pv, bytes):
                    piece = pv.decode("utf-8")
                elif pn == 2 and isinstance(pv, bytes):
                    score = struct.unpack("<f", pv)[0]
                elif pn == 3 and isinstance(pv, int):
                    kind = pv
            m.pieces.append((piece, score, kind))
        elif num == 2 and isinstance(val, bytes):
            for tn, _, tv in _fields(val):
                if tn == 3 and isinstance(tv, int):
                    m.model_type = tv
                elif tn == 35 and isinstance(tv, int):
                    m.byte_fallback = bool(tv)
                elif tn == 40 and isinstance(tv, int):
                    m.unk_id = tv
        elif num == 3 and isinstance(val, bytes):
            for nn, _, nv in _fields(val):
                if nn == 2 and isinstance(nv, bytes):
                    m.charsmap = nv
                elif nn == 3 and isinstance(nv, int):
                    m.add_dummy_prefix = bool(nv)
                elif nn == 4 and isinstance(nv, int):
                    m.remove_extra_whitespaces = bool(nv)
    if not m.pieces:
        raise ValueError("the SentencePiece model holds no pieces: not a SentencePiece .model file")
    return m


def _bpe_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    ranked = []
    for piece in vocab:
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-scores[piece], vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def tokenizer_from_spm(data: bytes) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` that encodes like the SentencePiece model serialized in ``data``."""
    m = parse_model(data)
    if m.model_type not in (_UNIGRAM, _BPE):
        raise ValueError(f"SentencePiece model_type {m.model_type} is not supported (only unigram=1 and "
                         "bpe=2)")
    model: models.Model
    if m.model_type == _UNIGRAM:
        model = models.Unigram([(p, s) for p, s, _ in m.pieces], m.unk_id, m.byte_fallback)
    else:
        vocab = {p: i for i, (p, _, _) in enumerate(m.pieces)}
        scores = {p: s for p, s, kind in m.pieces if kind in (_NORMAL, _USER_DEFINED, _BYTE)}
        scores.update({p: float("-inf") for p, _,
                       kind in m.pieces if kind not in (_NORMAL, _USER_DEFINED, _BYTE)})
        model = models.BPE(vocab, _bpe_merges(vocab, scores), unk_token=m.pieces[m.unk_id][0], fuse_unk=True,
                           byte_fallback=m.byte_fallback)
    tok = Tokenizer(model)
    norms: list[normalizers.Normalizer] = []
    if m.charsmap:
        norms.append(normalizers.Precompiled(m.charsmap))
    if m.remove_extra_whitespaces:
        norms += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    if norms:
        tok.normalizer = normalizers.Sequence(norms)
    scheme = "always" if m.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    steps: list[decoders.Decoder] = [decoders.Replace("▁", " ")]
    if m.byte_fallback:
        steps.append(decoders.ByteFallback())
    steps.append(decoders.Fuse())
    if m.add_dummy_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    specials = [p for p, _, kind in m.pieces if kind in (_CONTROL, _UNKNOWN)]
    tok.add_special_tokens([p for p in specials if p])
    return tok
