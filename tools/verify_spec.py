#!/usr/bin/env python3
"""verify_spec.py - check the fp4doctor CLI against an independent model of the spec.

Independent of fp4doctor's C code: everything here is written from
shared/spec/nvfp4-spec.md (sections 1-6) with the Python standard library only (integer
arithmetic for every rounding; no numpy, no struct-based float rounding). It

  1. builds safetensors inputs with its own writer (f32, bf16, f16: random, heavy-tailed,
     all-zero blocks and tensors, e2m1 tie points, e4m3 scale midpoints, scale saturation
     and underflow, NaN/Inf, subnormals, MXFP4 scales near 0 and 254),
  2. runs `fp4doctor quantize --format nvfp4|mxfp4` (default convention, linear and swizzled
     layouts) and compares every code byte and scale byte with its own quantizer
     (NVFP4: spec §4.2 flashinfer-exact, each f32 operation correctly rounded; MXFP4: §3.4
     TRT-LLM/FlashInfer UE8M0 rule) and X_scale_2 with RN(amax/2688) (must be within 1 ulp;
     exact equality is also reported),
     It also runs `fp4doctor dequantize` on every output (x = RN(RN(e2m1*scale)*scale_2))
     and checks the other named conventions (trtllm, modelopt, torchao, compressed-tensors,
     ocp) against models of spec §4.1/§4.5-§4.7 on the §4.8 edge rows and random data,
  3. builds quantized GEMM operands directly (random codes and scale bytes, NaN scales,
     cancellation, rounding midpoints, overflow, subnormal results, K up to 16384) and runs
     `fp4doctor gemm --backend ref --out-dtype f32|bf16|f16`, comparing every output element
     bit for bit with the exact sum (Python big integers) rounded once to nearest-even.

Run (from the repository root, after building the CLI):

    python3 tools/verify_spec.py [--fp4doctor build/fp4doctor] [--quick] [--seed N]
                                 [--only quantize|conventions|gemm] [--keep] [-v]

--quick is the small configuration used by ctest (a few seconds). Exit status 0 when every
byte and every element matches, 1 on any mismatch (each one is printed), 2 on usage errors.

Documented choices of fp4doctor that this script follows (docs/formats.md, docs/reference.md):
an exact zero GEMM result is +0; NaN results may be any NaN; NVFP4 scale bytes with bit 7 set
decode as NaN (unsigned e4m3, spec §2.5); the MXFP4 default uses the f32 product amax*RN(1/6).
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

# ---------------------------------------------------------------------------------------
# Exact rounding of rationals into binary formats (integers only).
# ---------------------------------------------------------------------------------------


def floor_log2(n, d):
    """floor(log2(n/d)) for integers n, d > 0."""
    e = n.bit_length() - d.bit_length()
    if e >= 0:
        if n < (d << e):
            e -= 1
    else:
        if (n << -e) < d:
            e -= 1
    return e


def round_rne(n, d, p, emin):
    """Round the positive rational n/d to nearest-even with p significand bits and smallest
    normal exponent emin (subnormals at quantum 2^(emin-p+1)); returns (q, t): q * 2^t."""
    e = max(floor_log2(n, d), emin)
    t = e - p + 1
    if t <= 0:
        num, den = n << -t, d
    else:
        num, den = n, d << t
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and (q & 1)):
        q += 1
    return q, t


class Fmt:
    def __init__(self, name, ebits, mbits):
        self.name, self.ebits, self.mbits = name, ebits, mbits
        self.p = mbits + 1
        self.bias = (1 << (ebits - 1)) - 1
        self.emin = 1 - self.bias
        self.emax = self.bias
        self.nbits = 1 + ebits + mbits
        # largest finite = (2^p - 1) * 2^(emax - mbits)
        self.max_q, self.max_t = (1 << self.p) - 1, self.emax - mbits
        self.sign_bit = 1 << (self.nbits - 1)
        self.inf_bits = ((1 << ebits) - 1) << mbits

    def encode_exact(self, sign, n, d):
        """Bits of RN(+-(n/d)); n >= 0, d > 0. Overflow -> inf."""
        s = self.sign_bit if sign else 0
        if n == 0:
            return s
        q, t = round_rne(n, d, self.p, self.emin)
        if q == 0:
            return s
        # compare q*2^t with max_q*2^max_t exactly
        if t >= self.max_t:
            big = (q << (t - self.max_t)) > self.max_q
        else:
            big = q > (self.max_q << (self.max_t - t))
        if big:
            return s | self.inf_bits
        e = q.bit_length() - 1 + t
        if e < self.emin:  # subnormal: multiple of 2^(emin - mbits)
            m = q << (t - (self.emin - self.mbits)) if t >= self.emin - self.mbits else q >> ((self.emin - self.mbits) - t)
            return s | m
        # normal: q*2^t = (1.f) * 2^e
        shift = t - (e - self.mbits)
        m = q << shift if shift >= 0 else q >> -shift
        return s | ((e + self.bias) << self.mbits) | (m - (1 << self.mbits))

    def decode(self, bits):
        """Python float (exact for f32/bf16/f16)."""
        s = -1.0 if bits & self.sign_bit else 1.0
        e = (bits >> self.mbits) & ((1 << self.ebits) - 1)
        m = bits & ((1 << self.mbits) - 1)
        if e == (1 << self.ebits) - 1:
            return s * math.inf if m == 0 else math.nan
        if e == 0:
            return s * math.ldexp(m, self.emin - self.mbits)
        return s * math.ldexp(m + (1 << self.mbits), e - self.bias - self.mbits)


F32 = Fmt("f32", 8, 23)
BF16 = Fmt("bf16", 8, 7)
F16 = Fmt("f16", 5, 10)
FLT_MAX = F32.decode(0x7F7FFFFF)
OUT_FMTS = {"f32": F32, "bf16": BF16, "f16": F16}


def f32_of_bits(b):
    return F32.decode(b)


def bits_of_f32(x):
    """Bits of a Python float that is exactly an f32 value (or inf/nan)."""
    if math.isnan(x):
        return 0x7FC00000
    n, d = abs(x).as_integer_ratio() if math.isfinite(x) else (0, 1)
    if math.isinf(x):
        return (0x80000000 if x < 0 else 0) | 0x7F800000
    b = F32.encode_exact(math.copysign(1.0, x) < 0, n, d)
    assert F32.decode(b) == x or (x == 0), (x, hex(b))
    return b


def rn32_ratio(sign, n, d):
    return F32.decode(F32.encode_exact(sign, n, d))


def f32_mul(a, b):
    """One IEEE binary32 multiplication, correctly rounded (a, b are f32 values)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b  # inf/nan rules are the same in double
    sign = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
    na, da = abs(a).as_integer_ratio()
    nb, db = abs(b).as_integer_ratio()
    return rn32_ratio(sign, na * nb, da * db)


def f32_div(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.nan
    sign = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
    if b == 0:
        if a == 0:
            return math.nan
        return -math.inf if sign else math.inf
    if math.isinf(b):
        if math.isinf(a):
            return math.nan
        return -0.0 if sign else 0.0
    if math.isinf(a):
        return -math.inf if sign else math.inf
    na, da = abs(a).as_integer_ratio()
    nb, db = abs(b).as_integer_ratio()
    return rn32_ratio(sign, na * db, da * nb)


def fminf(a, b):
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return min(a, b)


RCP6 = rn32_ratio(False, 1, 6)  # 1.0f/6.0f
assert bits_of_f32(RCP6) == 0x3E2AAAAB

# ---------------------------------------------------------------------------------------
# Scalar codecs from the spec's tables (§1, §2, §3).
# ---------------------------------------------------------------------------------------

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
STATS = {"e2m1 inputs exactly on a tie": 0, "e4m3 scales exactly on a midpoint": 0}


def e2m1_encode(x):
    """§1.2 RN-satfinite decision table; NaN -> 0x7, sign kept (incl. -0)."""
    if math.isnan(x):
        return 0x7
    if abs(x) in E2M1_TIES:
        STATS["e2m1 inputs exactly on a tie"] += 1
    s = 0x8 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a <= 0.25:
        c = 0
    elif a < 0.75:
        c = 1
    elif a <= 1.25:
        c = 2
    elif a < 1.75:
        c = 3
    elif a <= 2.5:
        c = 4
    elif a < 3.5:
        c = 5
    elif a <= 5.0:
        c = 6
    else:
        c = 7
    return s | c


def e2m1_half_units(code):
    """(sign, 2*|value|) of an e2m1 code."""
    return (code & 8) != 0, int(E2M1_VALUES[code & 7] * 2)


def e4m3_value(byte):
    """§2.1 decode: float value (NaN for 0x7F/0xFF)."""
    s = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * m * 2.0 ** -9
    return s * (8 + m) * 2.0 ** (e - 10)


def e4m3_satfinite(x):
    """§2.2 SATFINITE: RNE, |x| > 448 -> 448, NaN -> 0x7F."""
    if math.isnan(x):
        return 0x7F
    s = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a > 448.0:
        return s | 0x7E
    n, d = a.as_integer_ratio()
    if n == 0:
        return s
    q, t = round_rne(n, d, 4, -6)  # 4 significand bits, min normal 2^-6
    q2, t2 = round_rne(2 * n, d, 5, -5)  # one more bit: a midpoint is exact there
    if (q2 & 1) and q2 * 2.0 ** t2 == 2 * a:
        STATS["e4m3 scales exactly on a midpoint"] += 1
    v = q * 2.0 ** t
    if v == 0:
        return s
    # find the code whose value is v
    for c in range(0x7F):
        if e4m3_value(c) == v:
            return s | c
    raise AssertionError(v)


def ue8m0_rp_satfinite(x):
    """§3.2 round toward +inf to a power of two, clip to [2^-127, 2^127], NaN -> 0xFF."""
    if math.isnan(x):
        return 0xFF
    a = abs(x)
    if a == 0:
        return 0x00
    if math.isinf(a):
        return 0xFE
    n, d = a.as_integer_ratio()
    k = floor_log2(n, d)
    if not (n * (1 if k >= 0 else (1 << -k)) == d * ((1 << k) if k >= 0 else 1)):
        k += 1  # not a power of two: ceiling
    k = max(k, -127)
    if k > 127:
        return 0xFE
    return k + 127


# ---------------------------------------------------------------------------------------
# Independent quantizers.
# ---------------------------------------------------------------------------------------


def nvfp4_quantize_ref(rows, cols, x):
    """Spec §4.2 (flashinfer-exact) with gs = 2688/amax (§4.0, amax = |x|.nan_to_num().max()).
    Returns (codes bytes [rows, cols/2], scales [rows][cols/16], scale_2 value)."""
    amax = 0.0
    for v in x:
        if not math.isnan(v) and abs(v) > amax:
            amax = abs(v)
    if math.isinf(amax):
        amax = FLT_MAX
    gs = f32_div(2688.0, amax)
    scale_2 = f32_div(amax, 2688.0)
    g6 = f32_mul(gs, RCP6)
    inv_gs = f32_div(1.0, gs)
    codes = bytearray(rows * cols // 2)
    scales = [[0] * (cols // 16) for _ in range(rows)]
    for r in range(rows):
        for b in range(cols // 16):
            blk = x[r * cols + b * 16: r * cols + b * 16 + 16]
            finite = [abs(v) for v in blk if not math.isnan(v)]
            vmax = max(finite) if finite else math.nan
            sf = f32_mul(vmax, g6) if vmax != 0 else 0.0
            byte = e4m3_satfinite(sf)
            sfq = e4m3_value(byte)
            out = fminf(f32_div(1.0, f32_mul(sfq, inv_gs)), FLT_MAX) if vmax != 0 else 0.0
            q = [e2m1_encode(f32_mul(v, out)) for v in blk]
            scales[r][b] = byte
            base = (r * cols + b * 16) // 2
            for j in range(8):
                codes[base + j] = q[2 * j] | (q[2 * j + 1] << 4)
    return bytes(codes), scales, scale_2


def mxfp4_quantize_ref(rows, cols, x, exact_scale=False):
    """Spec §3.4 TRT-LLM/FI UE8M0_SF: S = ue8m0_RP_SATFINITE(amax * RCP6), multiplier
    exp2f_rcp(S) (S == 0 -> 1), 0 for an all-zero block. exact_scale=True uses the exact
    rational amax/6 instead of the f32 product (reported separately)."""
    codes = bytearray(rows * cols // 2)
    scales = [[0] * (cols // 32) for _ in range(rows)]
    for r in range(rows):
        for b in range(cols // 32):
            blk = x[r * cols + b * 32: r * cols + b * 32 + 32]
            finite = [abs(v) for v in blk if not math.isnan(v)]
            vmax = max(finite) if finite else math.nan
            if exact_scale and math.isfinite(vmax) and vmax > 0:
                n, d = vmax.as_integer_ratio()
                d *= 6
                k = floor_log2(n, d)
                if n * (1 if k >= 0 else 1 << -k) != d * ((1 << k) if k >= 0 else 1):
                    k += 1
                s = 0xFE if k > 127 else max(k, -127) + 127
            else:
                s = ue8m0_rp_satfinite(f32_mul(vmax, RCP6))
            if vmax != 0:
                out = 1.0 if s == 0 else math.ldexp(1.0, 127 - s)
            else:
                out = 0.0
            q = [e2m1_encode(f32_mul(v, out)) for v in blk]
            scales[r][b] = s
            base = (r * cols + b * 32) // 2
            for j in range(16):
                codes[base + j] = q[2 * j] | (q[2 * j + 1] << 4)
    return bytes(codes), scales


# ---- the other named conventions (spec §4.1, §4.5-§4.7, OCP floor), with the choices that
# docs/formats.md documents where the spec leaves one open (reciprocal model, NaN codes).

def f32_rcp_ftz(v):
    """rcp.approx.ftz modelled as docs/formats.md says: correctly rounded 1/v, subnormal
    input -> +-inf, subnormal result -> +-0 (a bound on the hardware, not its table)."""
    if math.isnan(v):
        return v
    if v == 0 or abs(v) < 2.0 ** -126:
        return -math.inf if math.copysign(1.0, v) < 0 else math.inf
    r = f32_div(1.0, v)
    if r != 0 and abs(r) < 2.0 ** -126:
        return math.copysign(0.0, r)
    return r


def torch_e4m3_cast(v):
    """torch .to(float8_e4m3fn) of a scale: RNE, > 464 and inf -> NaN; NaN written 0x7F."""
    if math.isnan(v) or abs(v) > 464.0:
        return 0x7F
    return e4m3_satfinite(v)


def blocks_of(x, rows, cols, bs):
    for r in range(rows):
        for b in range(cols // bs):
            yield r, b, x[r * cols + b * bs: r * cols + b * bs + bs]


def amax_nan_ignored(blk):
    finite = [abs(v) for v in blk if not math.isnan(v)]
    return max(finite) if finite else math.nan


def amax_torch(blk):
    if any(math.isnan(v) for v in blk):
        return math.nan
    return max(abs(v) for v in blk)


def clamp6(v):
    return v if math.isnan(v) else max(-6.0, min(6.0, v))


def quantize_convention_ref(conv, fmt, rows, cols, x):
    """(codes, scales, scale_2 or None) under a named convention."""
    bs = 16 if fmt == "nvfp4" else 32
    tensor_amax_t = amax_torch(x)
    fin = [abs(v) for v in x if not math.isnan(v)]
    amax_fi = max(fin) if fin else 0.0
    if math.isinf(amax_fi):
        amax_fi = FLT_MAX
    scale_2 = None
    codes_all = {}
    scales = [[0] * (cols // bs) for _ in range(rows)]
    if fmt == "nvfp4" and conv == "trtllm":
        gs = f32_div(2688.0, amax_fi)
        scale_2 = f32_div(amax_fi, 2688.0)
    elif fmt == "nvfp4" and conv in ("modelopt", "torchao"):
        gd = f32_div(tensor_amax_t, 2688.0)
        scale_2 = gd
    elif fmt == "nvfp4" and conv == "compressed-tensors":
        a = tensor_amax_t
        if not math.isnan(a) and a < 2.0 ** -126:
            a = 2.0 ** -126
        gs = f32_div(2688.0, a)
        if not math.isfinite(gs):
            gs = 1.0
        scale_2 = f32_div(1.0, gs)
    for r, b, blk in blocks_of(x, rows, cols, bs):
        if fmt == "nvfp4" and conv == "trtllm":
            vmax = amax_nan_ignored(blk)
            sf = f32_mul(gs, f32_mul(vmax, RCP6))
            byte = e4m3_satfinite(sf)
            sfq = e4m3_value(byte)
            out = f32_rcp_ftz(f32_mul(sfq, f32_rcp_ftz(gs))) if vmax != 0 else 0.0
            q = [e2m1_encode(f32_mul(v, out)) for v in blk]
        elif fmt == "nvfp4" and conv == "modelopt":
            vmax = amax_torch(blk)
            pbs = f32_div(vmax, f32_mul(6.0, gd))
            if pbs == 0:
                pbs = 1.0
            byte = torch_e4m3_cast(pbs)
            den = f32_mul(e4m3_value(byte), gd)
            q = []
            for v in blk:
                y = f32_div(v, den)
                if math.isnan(y):
                    q.append(0x7)
                else:  # searchsorted RNE, sign from y < 0 (so -0.0 -> 0x0)
                    q.append((0x8 if y < 0 else 0) | (e2m1_encode(abs(y)) & 7))
        elif fmt == "nvfp4" and conv == "torchao":
            vmax = amax_torch(blk)
            sc = f32_div(f32_div(vmax, 6.0), gd)
            if not math.isnan(sc):
                sc = min(max(sc, 2.0 ** -6), 448.0)
            byte = torch_e4m3_cast(sc)
            mult = f32_div(f32_div(1.0, gd), e4m3_value(byte))
            q = []
            for v in blk:
                y = clamp6(f32_mul(v, mult))
                if math.isnan(y):  # torchao's NaN code (spec §1.4, derived): 0x3, sign of the input
                    q.append(0xB if math.copysign(1.0, v) < 0 else 0x3)
                else:
                    q.append(e2m1_encode(y))
        elif fmt == "nvfp4" and conv == "compressed-tensors":
            vmax = amax_torch(blk)
            sc = f32_mul(gs, f32_div(vmax, 6.0))
            if not math.isnan(sc) and sc > 448.0:
                sc = 448.0
            byte = torch_e4m3_cast(sc)
            sfq = e4m3_value(byte)
            if sfq == 0:
                sfq, byte = 0.125, 0x30
            den = f32_div(sfq, gs)
            q = []
            for v in blk:
                y = clamp6(f32_div(v, den))
                if math.isnan(y):  # documented: magnitude 0 with the input's sign
                    q.append(0x8 if math.copysign(1.0, v) < 0 else 0)
                else:
                    q.append(e2m1_encode(y))
        elif fmt == "mxfp4" and conv == "ocp":
            vmax = amax_torch(blk)
            if not math.isfinite(vmax):
                byte, scale = 0xFF, math.inf
            else:
                field = bits_of_f32(vmax) >> 23 & 0xFF
                unb = max(field - 127 - 2, -127)
                byte = unb + 127
                scale = math.ldexp(1.0, max(unb, -126))
            q = [e2m1_encode(clamp6(f32_div(v, scale))) for v in blk]
        elif fmt == "mxfp4" and conv == "trtllm":
            c1, s1 = mxfp4_quantize_ref(1, bs, blk)
            byte = s1[0][0]
            q = []
            for j in range(bs // 2):
                q += [c1[j] & 0xF, c1[j] >> 4]
        else:
            raise ValueError(conv)
        scales[r][b] = byte
        codes_all[(r, b)] = q
    codes = bytearray(rows * cols // 2)
    for (r, b), q in codes_all.items():
        base = (r * cols + b * bs) // 2
        for j in range(bs // 2):
            codes[base + j] = q[2 * j] | (q[2 * j + 1] << 4)
    return bytes(codes), scales, scale_2


def swizzle_offset(layout, rows, C, r, c):
    """Spec §6."""
    Cp = (C + 3) // 4 * 4
    if layout == "swizzled":
        return (r // 128) * (128 * Cp) + (c // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + (c % 4)
    if layout == "swizzled8x4":
        return (r // 8) * (8 * Cp) + (c // 4) * 32 + (r % 8) * 4 + (c % 4)
    return r * C + c


def scale_buffer_shape(layout, rows, C):
    if layout == "linear":
        return [rows, C]
    tile = 128 if layout == "swizzled" else 8
    return [(rows + tile - 1) // tile * tile, (C + 3) // 4 * 4]


# ---------------------------------------------------------------------------------------
# safetensors, written and read independently (spec §7d).
# ---------------------------------------------------------------------------------------

DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "U8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


def st_write(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    blobs = []
    for name, dt, shape, raw in tensors:
        n = 1
        for s in shape:
            n *= s
        assert len(raw) == n * DTYPE_SIZE[dt], (name, len(raw), n)
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n].decode())
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[8 + n + b: 8 + n + e])
    return out, meta


def raw_from_bits(bits, width):
    fmt = "<I" if width == 4 else "<H"
    return b"".join(struct.pack(fmt, b) for b in bits)


# ---------------------------------------------------------------------------------------
# Test driver.
# ---------------------------------------------------------------------------------------


class Checker:
    def __init__(self, exe, workdir, verbose):
        self.exe, self.workdir, self.verbose = exe, workdir, verbose
        self.counts = {}
        self.failures = []
        self.notes = []
        self.n = 0

    def path(self, stem):
        self.n += 1
        return os.path.join(self.workdir, "%03d_%s.safetensors" % (self.n, stem))

    def run(self, args):
        p = subprocess.run([self.exe] + args, capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    def count(self, key, k=1):
        self.counts[key] = self.counts.get(key, 0) + k

    def fail(self, msg):
        self.failures.append(msg)
        if len(self.failures) <= 60:
            print("MISMATCH: " + msg)

    # ---- quantize ---------------------------------------------------------------------

    def quantize_case(self, name, dtype, rows, cols, bits, fmt="nvfp4", layout="linear", conv=None):
        """bits: input element bit patterns (width from dtype)."""
        width = 4 if dtype == "F32" else 2
        src_fmt = {"F32": F32, "BF16": BF16, "F16": F16}[dtype]
        x = [src_fmt.decode(b) for b in bits]
        inp, outp = self.path(name + "_in"), self.path(name + "_out")
        st_write(inp, [("w", dtype, [rows, cols], raw_from_bits(bits, width))])
        args = ["quantize", "--format", fmt]
        if layout != "linear":
            args += ["--scale-layout", layout]
        if conv:
            args += ["--convention", conv]
        rc, text = self.run(args + [inp, outp])
        tag = "%s[%s %s %dx%d %s%s]" % (name, fmt, dtype, rows, cols, layout, " " + conv if conv else "")
        if rc != 0:
            self.fail("%s: quantize exit %d: %s" % (tag, rc, text.strip()))
            return
        got, meta = st_read(outp)
        block = 16 if fmt == "nvfp4" else 32
        C = cols // block
        if conv:
            codes, scales, scale_2 = quantize_convention_ref(conv, fmt, rows, cols, x)
        elif fmt == "nvfp4":
            codes, scales, scale_2 = nvfp4_quantize_ref(rows, cols, x)
        else:
            codes, scales = mxfp4_quantize_ref(rows, cols, x)
        dt, shape, gcodes = got["w"]
        if dt != "U8" or shape != [rows, cols // 2]:
            self.fail("%s: codes tensor %s %s" % (tag, dt, shape))
            return
        bad = [i for i in range(len(codes)) if codes[i] != gcodes[i]]
        self.count("quantize code bytes", len(codes))
        if bad:
            i = bad[0]
            r, kb = divmod(i, cols // 2)
            blk = kb * 2 // block
            self.fail("%s: %d of %d code bytes differ; first [%d, byte %d]: got 0x%02x want 0x%02x; block %d inputs %s"
                      % (tag, len(bad), len(codes), r, kb, gcodes[i], codes[i], blk,
                         [x[r * cols + blk * block + j] for j in range(block)]))
        sdt, sshape, gscales = got["w_scale"]
        want_dt = "F8_E4M3" if fmt == "nvfp4" else "U8"
        want_shape = scale_buffer_shape(layout, rows, C)
        if sdt != want_dt or sshape != want_shape:
            self.fail("%s: scale tensor %s %s, want %s %s" % (tag, sdt, sshape, want_dt, want_shape))
            return
        want_buf = bytearray(want_shape[0] * want_shape[1])
        for r in range(rows):
            for c in range(C):
                want_buf[swizzle_offset(layout, rows, C, r, c)] = scales[r][c]
        badS = [i for i in range(len(want_buf)) if want_buf[i] != gscales[i]]
        self.count("quantize scale bytes", len(want_buf))
        if badS:
            i = badS[0]
            self.fail("%s: %d of %d scale bytes differ; first at offset %d: got 0x%02x want 0x%02x"
                      % (tag, len(badS), len(want_buf), i, gscales[i], want_buf[i]))
        if fmt == "nvfp4":
            s2dt, s2shape, s2raw = got["w_scale_2"]
            (gb,) = struct.unpack("<I", s2raw)
            wb = bits_of_f32(scale_2)
            self.count("X_scale_2 values")
            if s2dt != "F32" or s2shape not in ([], [1]):
                self.fail("%s: scale_2 %s %s" % (tag, s2dt, s2shape))
            elif math.isnan(scale_2) and math.isnan(F32.decode(gb)):
                pass
            elif abs(gb - wb) > (0 if conv else 1):
                self.fail("%s: X_scale_2 0x%08x, want RN(amax/2688) 0x%08x (more than 1 ulp)" % (tag, gb, wb))
            elif gb != wb:
                self.count("X_scale_2 1-ulp differences")
        elif "w_scale_2" in got:
            self.fail("%s: MXFP4 output has a w_scale_2" % tag)
        if fmt == "mxfp4" and not conv:
            ecodes, escales = mxfp4_quantize_ref(rows, cols, x, exact_scale=True)
            if escales != scales:
                self.count("mxfp4 blocks where exact amax/6 differs from f32 amax*RCP6")
        self.count("quantize cases")
        if self.verbose:
            print("ok  " + tag)
        # the operand as the spec says it should be, for gemm round trips
        unpacked = []
        for byte in codes:
            unpacked += [byte & 0xF, byte >> 4]
        # dequantize: x = RN(RN(e2m1 * scale) * scale_2) (docs/cli.md), MXFP4 without scale_2
        deq = self.path(name + "_deq")
        rc, text = self.run(["dequantize", outp, deq])
        if rc != 0:
            self.fail("%s: dequantize exit %d: %s" % (tag, rc, text.strip()))
        else:
            dgot, _ = st_read(deq)
            ddt, dshape, draw = dgot["w"]
            gb = struct.unpack("<%dI" % (len(draw) // 4), draw)
            nbad, first = 0, None
            for i, code in enumerate(unpacked):
                sb = scales[i // cols][(i % cols) // block]
                if fmt == "nvfp4":
                    sv = math.nan if (sb & 0x80 or sb == 0x7F) else e4m3_value(sb)
                else:
                    sv = math.nan if sb == 0xFF else math.ldexp(1.0, sb - 127)
                e = E2M1_VALUES[code & 7] * (-1.0 if code & 8 else 1.0)
                want = f32_mul(e, sv)
                if fmt == "nvfp4":
                    want = f32_mul(want, scale_2)
                g = F32.decode(gb[i])
                ok = (math.isnan(want) and math.isnan(g)) or (not math.isnan(want) and gb[i] == bits_of_f32(want))
                if not ok:
                    nbad += 1
                    first = first or (i, g, want)
            self.count("dequantize elements", len(unpacked))
            if ddt != "F32" or dshape != [rows, cols] or nbad:
                self.fail("%s: dequantize: %s %s, %d elements differ, first %r" % (tag, ddt, dshape, nbad, first))
        return outp, {"kind": fmt, "rows": rows, "K": cols, "codes": unpacked, "scales": scales,
                      "scale_2": scale_2 if fmt == "nvfp4" else None}

    # ---- gemm ---------------------------------------------------------------------------

    def gemm_case(self, name, A, B, out_dtypes=("f32", "bf16", "f16"), files=None):
        """A, B: operand dicts: kind (nvfp4|mxfp4|f32|bf16|f16), rows, K, and either
        'bits' (plain) or 'codes' (list of 4-bit codes, row-major), 'scales' (logical
        [rows][K/bs] bytes), 'scale_2' (f32 value or None), 'layout', 'scale_dtype'."""
        if files:  # operands already on disk (e.g. written by `fp4doctor quantize`)
            pa, pb = files
        else:
            pa, pb = self.path(name + "_A"), self.path(name + "_B")
            for op, path in ((A, pa), (B, pb)):
                st_write(path, *operand_tensors("x", op))
        alpha = 1.0
        sa, sb = A.get("scale_2"), B.get("scale_2")
        if sa is not None or sb is not None:
            alpha = f32_mul(sa if sa is not None else 1.0, sb if sb is not None else 1.0)
        want = gemm_exact(A, B, alpha)
        for od in out_dtypes:
            outp = self.path(name + "_out_" + od)
            sa_, sb_ = (pa, pb) if files else (pa + ":x", pb + ":x")
            rc, text = self.run(["gemm", "--backend", "ref", "--out-dtype", od, sa_, sb_, outp])
            tag = "%s[%s x %s, M=%d N=%d K=%d, %s]" % (name, A["kind"], B["kind"], A["rows"], B["rows"], A["K"], od)
            if rc != 0:
                self.fail("%s: gemm exit %d: %s" % (tag, rc, text.strip()))
                continue
            got, meta = st_read(outp)
            dt, shape, raw = got["out"]
            fmt = OUT_FMTS[od]
            if shape != [A["rows"], B["rows"]] or dt != {"f32": "F32", "bf16": "BF16", "f16": "F16"}[od]:
                self.fail("%s: out is %s %s" % (tag, dt, shape))
                continue
            width = 4 if od == "f32" else 2
            gbits = struct.unpack("<%d%s" % (len(raw) // width, "I" if width == 4 else "H"), raw)
            nbad = 0
            first = None
            for i, (g, w) in enumerate(zip(gbits, (rounded(v, fmt) for v in want))):
                self.count("gemm output elements")
                if w is None:  # NaN expected
                    if not math.isnan(fmt.decode(g)):
                        nbad += 1
                        first = first or (i, g, "NaN")
                    else:
                        self.count("gemm NaN outputs")
                elif g != w:
                    nbad += 1
                    first = first or (i, g, w)
            if nbad:
                i, g, w = first
                self.fail("%s: %d of %d elements differ; first [%d,%d]: got 0x%x want %s (exact %s)"
                          % (tag, nbad, len(gbits), i // B["rows"], i % B["rows"], g,
                             w if isinstance(w, str) else "0x%x" % w, describe(want[i])))
            ga = meta.get("fp4doctor.alpha")
            if ga is not None and not (to_f32(float(ga)) == alpha or (math.isnan(alpha) and math.isnan(float(ga)))):
                self.fail("%s: metadata alpha %s, want %r" % (tag, ga, alpha))
            self.count("gemm runs")
            if self.verbose and not nbad:
                print("ok  " + tag)


def operand_tensors(name, op):
    kind = op["kind"]
    rows, K = op["rows"], op["K"]
    if kind in ("f32", "bf16", "f16"):
        dt = {"f32": "F32", "bf16": "BF16", "f16": "F16"}[kind]
        return [(name, dt, [rows, K], raw_from_bits(op["bits"], 4 if kind == "f32" else 2))], None
    codes = op["codes"]
    cache = {}
    parts = []
    for r in range(rows):
        row = tuple(codes[r * K:(r + 1) * K])
        if row not in cache:
            cache[row] = bytes(row[i] | (row[i + 1] << 4) for i in range(0, K, 2))
        parts.append(cache[row])
    packed = b"".join(parts)
    bs = 16 if kind == "nvfp4" else 32
    C = K // bs
    layout = op.get("layout", "linear")
    shape = scale_buffer_shape(layout, rows, C)
    buf = bytearray(shape[0] * shape[1])
    for r in range(rows):
        for c in range(C):
            buf[swizzle_offset(layout, rows, C, r, c)] = op["scales"][r][c]
    sdt = op.get("scale_dtype", "F8_E4M3" if kind == "nvfp4" else "U8")
    tensors = [(name, "U8", [rows, K // 2], packed), (name + "_scale", sdt, shape, bytes(buf))]
    if op.get("scale_2") is not None:
        tensors.append((name + "_scale_2", "F32", op.get("scale_2_shape", []),
                        struct.pack("<I", bits_of_f32(op["scale_2"]))))
    # a decoy tensor whose name shares the prefix, to check the lookup
    tensors.append((name + "_scale_2_extra" if op.get("decoy") else name + "x_unrelated", "F32", [2], b"\0" * 8))
    if op.get("no_meta"):  # rely on the dtype/shape rules and the default (linear) layout
        assert layout == "linear"
        return tensors, None
    meta = {"fp4doctor.scale_layout." + name: layout, "fp4doctor.format." + name: kind}
    return tensors, meta


SHIFT_A = 160   # every A value times 2^160 is an integer (f32 >= 2^-149, e2m1*ue8m0 >= 2^-128)
SHIFT_B = 160


def decode_scaled(op, r, k):
    """Value of operand element as ('num', integer v*2^SHIFT) or ('nan',) / ('inf', sign)."""
    kind = op["kind"]
    if kind in ("f32", "bf16", "f16"):
        fmt = {"f32": F32, "bf16": BF16, "f16": F16}[kind]
        v = fmt.decode(op["bits"][r * op["K"] + k])
        if math.isnan(v):
            return ("nan",)
        if math.isinf(v):
            return ("inf", v < 0)
        n, d = abs(v).as_integer_ratio()
        iv = (n << SHIFT_A) // d
        assert iv * d == n << SHIFT_A
        return ("num", -iv if v < 0 else iv)
    code = op["codes"][r * op["K"] + k]
    sign, h = e2m1_half_units(code)  # value = h/2
    if kind == "nvfp4":
        sb = op["scales"][r][k // 16]
        if sb & 0x80 or sb == 0x7F:  # unsigned e4m3 (spec §2.5): bit 7 set is not a value
            return ("nan",)
        sv = e4m3_value(sb)
        n, d = sv.as_integer_ratio()
        iv = (h * n << SHIFT_B) // (2 * d)
        assert iv * 2 * d == h * n << SHIFT_B
    else:
        sb = op["scales"][r][k // 32]
        if sb == 0xFF:
            return ("nan",)
        e = sb - 127 - 1  # h/2 * 2^(sb-127)
        iv = h << (SHIFT_B + e) if SHIFT_B + e >= 0 else None
        assert iv is not None
    return ("num", -iv if sign else iv)


def gemm_exact(A, B, alpha):
    """Exact alpha * sum as ('num', n, d) / ('nan',) / ('inf', neg) / ('zero',) per element."""
    M, N, K = A["rows"], B["rows"], A["K"]

    def rows_of(op):
        # identical rows (same codes and scales, or same bits) are decoded once
        cache, out = {}, []
        for r in range(op["rows"]):
            if "bits" in op:
                key = tuple(op["bits"][r * K:(r + 1) * K])
            else:
                key = (tuple(op["codes"][r * K:(r + 1) * K]), tuple(op["scales"][r]))
            if key not in cache:
                cache[key] = (len(cache), [decode_scaled(op, r, k) for k in range(K)])
            out.append(cache[key])
        return out

    Arows, Brows = rows_of(A), rows_of(B)
    res = []
    memo = {}
    an, ad = (abs(alpha).as_integer_ratio() if math.isfinite(alpha) else (None, None))
    for m in range(M):
        aid, ar = Arows[m]
        for n in range(N):
            bid, br = Brows[n]
            if (aid, bid) in memo:
                res.append(memo[(aid, bid)])
                continue
            start = len(res)
            nan = False
            pinf = ninf = False
            acc = 0
            for a, b in zip(ar, br):
                if a[0] == "num" and b[0] == "num":
                    acc += a[1] * b[1]
                    continue
                if a[0] == "nan" or b[0] == "nan":
                    nan = True
                    continue
                # an infinity times something
                if a[0] == "inf" and b[0] == "inf":
                    neg = a[1] != b[1]
                elif a[0] == "inf":
                    if b[1] == 0:
                        nan = True
                        continue
                    neg = a[1] != (b[1] < 0)
                else:
                    if a[1] == 0:
                        nan = True
                        continue
                    neg = b[1] != (a[1] < 0)
                if neg:
                    ninf = True
                else:
                    pinf = True
            if nan or (pinf and ninf) or math.isnan(alpha):
                res.append(("nan",))
            elif pinf or ninf:
                if alpha == 0:
                    res.append(("nan",))
                else:
                    res.append(("inf", ninf != (alpha < 0)))
            elif math.isinf(alpha):
                res.append(("nan",) if acc == 0 else ("inf", (acc < 0) != (alpha < 0)))
            else:
                neg = (acc < 0) != (math.copysign(1.0, alpha) < 0)
                num = abs(acc) * an
                den = ad << (SHIFT_A + SHIFT_B)
                res.append(("num", neg, num, den) if num else ("zero",))
            memo[(aid, bid)] = res[start]
    return res


def rounded(v, fmt):
    if v[0] == "nan":
        return None
    if v[0] == "inf":
        return (fmt.sign_bit if v[1] else 0) | fmt.inf_bits
    if v[0] == "zero":
        return 0  # documented: exact zero -> +0
    return fmt.encode_exact(v[1], v[2], v[3])


def describe(v):
    if v[0] == "num":
        return ("-" if v[1] else "") + repr(v[2] / v[3]) if v[3] < 1 << 1000 else "tiny"
    return v[0]


# ---------------------------------------------------------------------------------------
# Input generators.
# ---------------------------------------------------------------------------------------


def f32_bits_list(vals):
    return [bits_of_f32(v) if not math.isnan(v) else 0x7FC00000 for v in vals]


def to_f32(v):
    """Round a Python float to f32 (RNE)."""
    if math.isnan(v) or math.isinf(v):
        return v
    n, d = abs(v).as_integer_ratio()
    return rn32_ratio(v < 0 or (v == 0 and math.copysign(1, v) < 0), n, d) if n else math.copysign(0.0, v)


def nextafter32(v, up):
    b = bits_of_f32(v)
    if v == 0:
        return f32_of_bits(1) if up else -f32_of_bits(1)
    if (v > 0) == up:
        b += 1
    else:
        b -= 1
    return f32_of_bits(b)


def random_f32(rng, kind):
    if kind == "normal":
        return to_f32(rng.gauss(0, 1))
    if kind == "heavy":  # Cauchy-like with a huge exponent range
        return to_f32(rng.choice((-1, 1)) * math.ldexp(rng.random() + 0.5, rng.randint(-60, 60)))
    if kind == "cauchy":
        return to_f32(math.tan(math.pi * (rng.random() - 0.5)))
    raise ValueError(kind)


def bits_random_16(rng, fmt, n, finite_only=True):
    out = []
    while len(out) < n:
        b = rng.getrandbits(16)
        v = fmt.decode(b)
        if finite_only and not math.isfinite(v):
            continue
        out.append(b)
    return out


def quantize_suite(ck, rng, quick):
    rows_cols = [(3, 32), (5, 64)] if quick else [(1, 16), (3, 32), (7, 64), (33, 48), (130, 80), (17, 160)]
    # 1. random / heavy-tailed, all three source types
    for kind in ("normal", "heavy", "cauchy"):
        for rows, cols in rows_cols:
            vals = [random_f32(rng, kind) for _ in range(rows * cols)]
            ck.quantize_case("rand_" + kind, "F32", rows, cols, f32_bits_list(vals))
            if cols % 32 == 0:
                ck.quantize_case("rand_" + kind, "F32", rows, cols, f32_bits_list(vals), fmt="mxfp4")
    for fmt16, dt in ((BF16, "BF16"), (F16, "F16")):
        for rows, cols in rows_cols:
            bits = bits_random_16(rng, fmt16, rows * cols)
            ck.quantize_case("rand16", dt, rows, cols, bits)
            if cols % 32 == 0:
                ck.quantize_case("rand16", dt, rows, cols, bits, fmt="mxfp4")
        # narrower range (typical weights)
        bits = [b for b in bits_random_16(rng, fmt16, 4 * 64 * 4) if abs(fmt16.decode(b)) < 4][:4 * 64]
        while len(bits) < 4 * 64:
            bits.append(0)
        ck.quantize_case("typical16", dt, 4, 64, bits)
        ck.quantize_case("typical16", dt, 4, 64, bits, fmt="mxfp4")

    # 2. all-zero blocks, -0.0, an all-zero tensor
    vals = [random_f32(rng, "normal") for _ in range(4 * 64)]
    for j in range(16, 48):
        vals[j] = 0.0
    for j in range(64, 96):
        vals[j] = -0.0
    for j in range(200, 232):
        vals[j] = 0.0 if j % 2 else -0.0
    ck.quantize_case("zero_blocks", "F32", 4, 64, f32_bits_list(vals))
    ck.quantize_case("zero_blocks", "F32", 4, 64, f32_bits_list(vals), fmt="mxfp4")
    for dt, z in (("F32", [0] * 128), ("F32", [0x80000000] * 128), ("BF16", [0] * 128), ("F16", [0x8000] * 128)):
        ck.quantize_case("all_zero", dt, 2, 64, z)
        ck.quantize_case("all_zero", dt, 2, 64, z, fmt="mxfp4")

    # 3. e2m1 tie points: gs = 1 exactly (one element 2688 fixes amax), block scales s with
    #    vmax = 6s; elements t*s and their f32 neighbours.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    scales = [1.0, 0.5, 2.0, 1.125, 1.375, 3.75, 448.0, 0.015625, 0.0546875, 2.0 ** -9 * 3, 240.0, 13.0]
    rows = []
    for s in scales:
        row = [6.0 * s] if 6.0 * s <= 2688 else [2688.0]
        for t in ties:
            v = to_f32(t * s)
            row += [v, -v]
        row = row[:15] + [2688.0 if s == 448.0 else 0.0]
        rows.append(row[:16])
        row2 = [6.0 * s]
        for t in ties:
            v = to_f32(t * s)
            row2 += [nextafter32(v, True), nextafter32(v, False)]
        rows.append((row2 + [0.0] * 16)[:16])
    flat = [v for r in rows for v in r]
    flat = [2688.0] + [0.0] * 15 + flat  # first block fixes the tensor amax: gs = 2688/2688 = 1
    ck.quantize_case("e2m1_ties", "F32", len(flat) // 16, 16, f32_bits_list(flat))
    # two rows of 32 so the same inputs also go through mxfp4 (ties at exact powers of two)
    mx = []
    for k in (-3, 0, 5, -20, 40):
        blk = [6.0 * 2.0 ** k]
        for t in ties:
            blk += [t * 2.0 ** k, -t * 2.0 ** k, nextafter32(t * 2.0 ** k, True), nextafter32(t * 2.0 ** k, False)]
        mx.append((blk + [0.0] * 32)[:32])
    flat = [v for r in mx for v in r]
    ck.quantize_case("e2m1_ties_mx", "F32", len(mx), 32, f32_bits_list(flat), fmt="mxfp4")

    # 4. e4m3 scale midpoints: vmax such that RN(vmax * RCP6) (gs = 1) lands exactly on a
    #    midpoint between two e4m3 values (normal and subnormal range) and on 2^-10.
    mids = []
    for c in range(0, 0x7E):
        lo, hi = e4m3_value(c), e4m3_value(c + 1)
        mids.append((lo + hi) / 2)
    mids += [2.0 ** -10, 448.0, 464.0 - 2.0 ** -10]
    blocks = []
    for mpt in mids:
        v = to_f32(mpt * 6.0)
        hit = None
        cand = v
        for _ in range(8):
            if f32_mul(cand, RCP6) == mpt:
                hit = cand
                break
            cand = nextafter32(cand, f32_mul(cand, RCP6) < mpt)
        use = hit if hit is not None else v
        if use > 2688.0:
            continue
        blk = [use, -use * 0.75, use * 0.25, use / 6, nextafter32(use / 12, True)] + [to_f32(use * rng.random()) for _ in range(11)]
        blocks.append(blk)
        ck.count("e4m3 midpoints hit exactly" if hit is not None else "e4m3 midpoints approximated")
    flat = [2688.0] + [0.0] * 15 + [v for b in blocks for v in b]
    ck.quantize_case("e4m3_mid", "F32", len(flat) // 16, 16, f32_bits_list(flat))
    if not quick:
        flat = flat[:len(flat) // 32 * 32]
        ck.quantize_case("e4m3_mid_swz", "F32", len(flat) // 32, 32, f32_bits_list(flat), layout="swizzled")

    # 5. saturation at 448 and underflow (SF <= 2^-10, subnormal e4m3 scales), with the
    #    tensor amax at various magnitudes.
    for amax in (2688.0, 1.0, 3.0e38, FLT_MAX, 1e-20, 7.0):
        amax = to_f32(amax)
        blocks = []
        blk = [amax] + [to_f32(amax * rng.uniform(-1, 1)) for _ in range(15)]
        blocks.append(blk)
        for ratio in (2.0 ** -9, 2.0 ** -10, 2.0 ** -11, 2.0 ** -12, 3 * 2.0 ** -13, 2.0 ** -16,
                      2.0 ** -20, 1e-7, 0.99e-6, 2.0 ** -8, 2.0 ** -6, 1.5 * 2.0 ** -7):
            # block amax = ratio * 6 * (tensor amax / 2688) * 448 ... i.e. SF ~ ratio * 448
            vm = to_f32(amax * ratio)
            if vm == 0 or not math.isfinite(vm):
                continue
            blocks.append([vm, -vm, to_f32(vm / 2), to_f32(-vm / 3)] + [to_f32(vm * rng.uniform(-1, 1)) for _ in range(11)] + [0.0])
        flat = [v for b in blocks for v in b]
        ck.quantize_case("sat_underflow_%g" % amax, "F32", len(blocks), 16, f32_bits_list(flat))

    # 6. NaN / Inf inputs
    nan, inf = math.nan, math.inf
    vals = [random_f32(rng, "normal") for _ in range(6 * 32)]
    vals[3] = nan                        # one NaN in a block
    for j in range(32, 48):              # an all-NaN NVFP4 block
        vals[j] = nan
    for j in range(64, 96):              # an all-NaN MXFP4 block
        vals[j] = nan
    vals[100] = inf                      # +inf element
    vals[140] = -inf
    vals[141] = nan
    ck.quantize_case("nan_inf", "F32", 6, 32, f32_bits_list(vals))
    ck.quantize_case("nan_inf", "F32", 6, 32, f32_bits_list(vals), fmt="mxfp4")
    bits = [0x7FC1, 0xFFC0, 0x7F80, 0xFF80] + bits_random_16(rng, BF16, 60)
    ck.quantize_case("nan_inf16", "BF16", 2, 32, bits)
    ck.quantize_case("nan_inf16", "BF16", 2, 32, bits, fmt="mxfp4")
    bits = [0x7E00, 0xFC00, 0x7C00] + bits_random_16(rng, F16, 61)
    ck.quantize_case("nan_inf16", "F16", 2, 32, bits)
    ck.quantize_case("nan_inf16", "F16", 2, 32, bits, fmt="mxfp4")

    # all-NaN and all-infinite tensors, a tensor whose only nonzero is -inf
    for name, v in (("all_nan", math.nan), ("all_inf", math.inf)):
        ck.quantize_case(name, "F32", 2, 32, f32_bits_list([v] * 64))
        ck.quantize_case(name, "F32", 2, 32, f32_bits_list([v] * 64), fmt="mxfp4")
    ck.quantize_case("neg_inf_only", "F32", 2, 32, f32_bits_list([-math.inf] + [0.0] * 63))
    ck.quantize_case("neg_inf_only", "F32", 2, 32, f32_bits_list([-math.inf] + [0.0] * 63), fmt="mxfp4")

    # 7. subnormal f32 inputs (alone, and next to normal values)
    sub = [f32_of_bits(rng.randint(1, 0x7FFFFF) | (rng.getrandbits(1) << 31)) for _ in range(64)]
    ck.quantize_case("subnormal_only", "F32", 2, 32, f32_bits_list(sub))
    ck.quantize_case("subnormal_only", "F32", 2, 32, f32_bits_list(sub), fmt="mxfp4")
    mixed = [random_f32(rng, "normal") for _ in range(32)] + sub
    ck.quantize_case("subnormal_mixed", "F32", 3, 32, f32_bits_list(mixed))
    ck.quantize_case("subnormal_mixed", "F32", 3, 32, f32_bits_list(mixed), fmt="mxfp4")
    tiny_norm = [to_f32(v * 1e-36) for v in (random_f32(rng, "normal") for _ in range(64))]
    ck.quantize_case("tiny_amax", "F32", 2, 32, f32_bits_list(tiny_norm))

    # 8. MXFP4: block amax from the largest to the smallest exponents (scale bytes near 0
    #    and 254), exact powers of two times 6 and their neighbours.
    blocks = []
    for e in list(range(-149, -120)) + [-100, -50, -1, 0, 1, 50, 100] + list(range(120, 128)):
        for base in (1.0, 1.5, 6.0, 6.0 * (1 + 2.0 ** -23), 6.0 * (1 - 2.0 ** -24), 3.0, 4.0, 7.0):
            v = to_f32(base * 2.0 ** e) if base * 2.0 ** e < 3.4e38 else FLT_MAX
            if v == 0 or math.isinf(v):
                continue
            blk = [v] + [to_f32(v * rng.uniform(-1, 1)) for _ in range(30)] + [-v / 2]
            blocks.append([to_f32(b) for b in blk])
    blocks.append([FLT_MAX] * 32)
    blocks.append([math.inf] + [1.0] * 31)
    blocks.append([f32_of_bits(1)] * 32)
    blocks.append([f32_of_bits(0x01400001)] + [0.0] * 31)   # amax/6 = 2^-127 (1 + 2^-24) region
    blocks.append([f32_of_bits(0x00C00000)] + [0.0] * 31)   # 1.5 * 2^-126 / ... = 6 * 2^-129
    flat = [v for b in blocks for v in b]
    ck.quantize_case("mx_exponents", "F32", len(blocks), 32, f32_bits_list(flat), fmt="mxfp4")
    # 16-bit sources over their whole range for MXFP4
    for fmt16, dt in ((BF16, "BF16"), (F16, "F16")):
        bits = []
        for r in range(16):
            e_shift = rng.randint(0, 0xFF if dt == "BF16" else 0x1F)
            for _ in range(32):
                b = rng.getrandbits(16)
                if dt == "BF16":
                    b = (b & 0x807F) | (min(e_shift + rng.randint(-3, 0), 0xFE) & 0xFF if e_shift > 3 else e_shift) << 7
                else:
                    b = (b & 0x83FF) | (min(max(e_shift + rng.randint(-3, 0), 0), 0x1E) << 10)
                bits.append(b)
        ck.quantize_case("mx_range16", dt, 16, 32, bits, fmt="mxfp4")
        ck.quantize_case("mx_range16", dt, 8, 64, bits)

    # 9. swizzled layouts with padding
    shapes = [(1, 16), (130, 80), (5, 48)] if not quick else [(130, 80)]
    for rows, cols in shapes:
        vals = [random_f32(rng, "heavy") for _ in range(rows * cols)]
        for layout in ("swizzled", "swizzled8x4"):
            ck.quantize_case("layout", "F32", rows, cols, f32_bits_list(vals), layout=layout)
        if cols % 32 == 0:
            ck.quantize_case("layout", "F32", rows, cols, f32_bits_list(vals), fmt="mxfp4", layout="swizzled")
    if not quick:
        rows, cols = 257, 32 * 9
        vals = [random_f32(rng, "normal") for _ in range(rows * cols)]
        ck.quantize_case("layout_big", "F32", rows, cols, f32_bits_list(vals), fmt="mxfp4", layout="swizzled")
        ck.quantize_case("layout_big", "F32", rows, cols, f32_bits_list(vals), fmt="nvfp4", layout="swizzled8x4")


def convention_suite(ck, rng, quick):
    """The non-default conventions on the spec §4.8 edge rows and random data."""
    nan, inf = math.nan, math.inf
    inputs = []
    vals = [random_f32(rng, "normal") for _ in range(8 * 32)]
    for j in range(0, 32):
        vals[j] = 0.0                                   # all-zero blocks
    vals[40] = nan                                      # one NaN in a block
    for j in range(64, 96):
        vals[j] = nan                                   # all-NaN blocks
    vals[100] = inf
    vals[130] = -inf                                    # +-inf elements
    vals[160:176] = [-0.0] * 16
    inputs.append(("edge_rows", "F32", 8, 32, f32_bits_list(vals)))
    inputs.append(("all_zero", "F32", 2, 32, [0] * 64))
    vals = [random_f32(rng, "normal") for _ in range(4 * 32)]
    vals[0] = 2688.0                                    # gs = 1
    for j, ratio in enumerate((2.0 ** -10, 2.0 ** -11, 2.0 ** -16, 3 * 2.0 ** -12)):
        blk = 32 + 16 * j
        vals[blk:blk + 16] = [to_f32(ratio * 6 * rng.uniform(-1, 1)) for _ in range(16)]
        vals[blk] = to_f32(ratio * 6)                    # 0 < SF <= 2^-10 and near it
    inputs.append(("underflow", "F32", 4, 32, f32_bits_list(vals)))
    for kind in ("normal", "heavy", "cauchy"):
        n = 3 if quick else 9
        inputs.append(("rand_" + kind, "F32", n, 64, f32_bits_list([random_f32(rng, kind) for _ in range(n * 64)])))
    inputs.append(("rand_bf16", "BF16", 4, 64, bits_random_16(rng, BF16, 256)))
    inputs.append(("rand_f16", "F16", 4, 64, bits_random_16(rng, F16, 256)))
    sub = [f32_of_bits(rng.randint(1, 0x7FFFFF) | (rng.getrandbits(1) << 31)) for _ in range(64)]
    inputs.append(("subnormal", "F32", 2, 32, f32_bits_list(sub)))
    for name, dt, rows, cols, bits in inputs:
        for conv in ("trtllm", "modelopt", "torchao", "compressed-tensors"):
            ck.quantize_case("conv_" + name, dt, rows, cols, bits, conv=conv)
        for conv in ("trtllm", "ocp"):
            ck.quantize_case("conv_" + name, dt, rows, cols, bits, fmt="mxfp4", conv=conv)


# ---- gemm operands -----------------------------------------------------------------------

def rand_nvfp4(rng, rows, K, scale_lo=0x20, scale_hi=0x50, scale_2=None, layout="linear"):
    return {"kind": "nvfp4", "rows": rows, "K": K, "codes": [rng.randrange(16) for _ in range(rows * K)],
            "scales": [[rng.randint(scale_lo, scale_hi) for _ in range(K // 16)] for _ in range(rows)],
            "scale_2": scale_2, "layout": layout}


def rand_mxfp4(rng, rows, K, lo=110, hi=140, layout="linear", scale_dtype="U8"):
    return {"kind": "mxfp4", "rows": rows, "K": K, "codes": [rng.randrange(16) for _ in range(rows * K)],
            "scales": [[rng.randint(lo, hi) for _ in range(K // 32)] for _ in range(rows)],
            "scale_2": None, "layout": layout, "scale_dtype": scale_dtype}


def plain(kind, rows, K, vals):
    fmt = {"f32": F32, "bf16": BF16, "f16": F16}[kind]
    bits = []
    for v in vals:
        if math.isnan(v):
            bits.append(0x7FC00000 if kind == "f32" else (0x7FC0 if kind == "bf16" else 0x7E00))
        elif math.isinf(v):
            bits.append(((fmt.sign_bit if v < 0 else 0) | fmt.inf_bits))
        else:
            n, d = abs(v).as_integer_ratio()
            bits.append(fmt.encode_exact(math.copysign(1, v) < 0, n, d))
    return {"kind": kind, "rows": rows, "K": K, "bits": bits}


def gemm_suite(ck, rng, quick):
    Ks = [16, 64, 512] if quick else [16, 32, 64, 512, 4096, 16384]
    # random nvfp4 x nvfp4 with alpha from two scale_2
    for K in Ks:
        M, N = (3, 2) if K >= 4096 else (4, 3)
        sa, sb = to_f32(rng.uniform(1e-4, 1e-2)), to_f32(rng.uniform(1e-4, 1e-2))
        ck.gemm_case("nv_nv_K%d" % K, rand_nvfp4(rng, M, K, scale_2=sa), rand_nvfp4(rng, N, K, scale_2=sb))
    # full scale-byte range (incl. subnormal e4m3 scales), swizzled layouts
    ck.gemm_case("nv_nv_fullscale", rand_nvfp4(rng, 5, 64, 0x00, 0x7E, scale_2=to_f32(1 / 3.0), layout="swizzled"),
                 rand_nvfp4(rng, 3, 64, 0x00, 0x7E, scale_2=to_f32(1 / 7.0), layout="swizzled8x4"))
    # mxfp4 x mxfp4, narrow and wide exponents, F8_E8M0 scale dtype
    for K in Ks:
        M, N = (3, 2) if K >= 4096 else (4, 3)
        ck.gemm_case("mx_mx_K%d" % (K if K % 32 == 0 else 32), rand_mxfp4(rng, M, max(K, 32)), rand_mxfp4(rng, N, max(K, 32)))
    ck.gemm_case("mx_mx_wide", rand_mxfp4(rng, 4, 64, 0, 254, layout="swizzled"),
                 rand_mxfp4(rng, 3, 64, 0, 254, scale_dtype="F8_E8M0"))
    ck.gemm_case("mx_mx_tiny", rand_mxfp4(rng, 3, 64, 0, 6), rand_mxfp4(rng, 3, 64, 0, 6))
    ck.gemm_case("mx_mx_huge", rand_mxfp4(rng, 3, 64, 250, 254), rand_mxfp4(rng, 3, 64, 120, 127))
    # bf16/f16/f32 activations x nvfp4 / mxfp4
    for K in Ks:
        M, N = (2, 2) if K >= 4096 else (3, 3)
        vals = [to_f32(rng.gauss(0, 1)) for _ in range(M * K)]
        ck.gemm_case("f32_nv_K%d" % K, plain("f32", M, K, vals), rand_nvfp4(rng, N, K, scale_2=to_f32(rng.uniform(0.001, 1))))
        b16 = bits_random_16(rng, BF16, M * K)
        ck.gemm_case("bf16_nv_K%d" % K, {"kind": "bf16", "rows": M, "K": K, "bits": b16}, rand_nvfp4(rng, N, K, scale_2=to_f32(0.37)))
        if K % 32 == 0:
            h16 = bits_random_16(rng, F16, M * K)
            ck.gemm_case("f16_mx_K%d" % K, {"kind": "f16", "rows": M, "K": K, "bits": h16}, rand_mxfp4(rng, N, K))
    # heavy-tailed f32 activations over the whole exponent range
    vals = [f32_of_bits(rng.getrandbits(32) & 0xFF7FFFFF) for _ in range(3 * 256)]  # finite, random exponents
    vals = [v if math.isfinite(v) else 1.0 for v in vals]
    ck.gemm_case("f32full_nv", plain("f32", 3, 256, vals), rand_nvfp4(rng, 3, 256, 0x00, 0x7E))
    ck.gemm_case("f32full_mx", plain("f32", 3, 256, vals), rand_mxfp4(rng, 3, 256, 0, 254))
    # nvfp4 x mxfp4 and mxfp4 x nvfp4 (mixed)
    ck.gemm_case("nv_mx", rand_nvfp4(rng, 3, 64, scale_2=to_f32(0.1)), rand_mxfp4(rng, 2, 64))
    ck.gemm_case("mx_nv", rand_mxfp4(rng, 3, 64), rand_nvfp4(rng, 2, 64, scale_2=to_f32(0.3)))

    # heavy cancellation: A row k-th half mirrors the first half with negated codes, so the
    # sum is exactly zero, then a few elements are perturbed.
    for K in ([512] if quick else [512, 16384]):
        A = rand_nvfp4(rng, 3, K, 0x40, 0x7E, scale_2=to_f32(0.01))
        B = rand_nvfp4(rng, 2, K, 0x40, 0x7E, scale_2=to_f32(0.02))
        h = K // 2
        for r in range(3):
            for k in range(h):
                A["codes"][r * K + h + k] = A["codes"][r * K + k] ^ 0x8
            A["scales"][r][h // 16:] = A["scales"][r][:h // 16]
        for n in range(2):
            B["codes"][n * K + h: n * K + K] = B["codes"][n * K: n * K + h]
            B["scales"][n][h // 16:] = B["scales"][n][:h // 16]
        A["codes"][1 * K + 5] = 0x1  # row 1: tiny residual
        A["scales"][1][0] = 0x01
        A["codes"][2 * K + K - 1] ^= 0x8  # row 2: one flipped sign
        ck.gemm_case("cancel_nv_K%d" % K, A, B)
        # f32 activations: +-2^100-ish terms cancelling, leaving tiny ones
        vals = []
        for r in range(2):
            row = []
            for k in range(K // 2):
                row.append(to_f32(math.ldexp(rng.random() + 1, rng.randint(60, 100))))
            row = row + [-v for v in row]
            for j in range(8):
                row[rng.randrange(K)] = to_f32(math.ldexp(rng.random(), -rng.randint(0, 40)))
            vals += row
        Bc = rand_nvfp4(rng, 2, K, 0x38, 0x38)
        for n in range(2):
            Bc["codes"][n * K + K // 2: n * K + K] = Bc["codes"][n * K: n * K + K // 2]
        ck.gemm_case("cancel_f32_K%d" % K, plain("f32", 2, K, vals), Bc)

    # outputs exactly on bf16 / f16 / f32 midpoints: B = all ones (code 0x2, scale 1.0), so
    # out = alpha * sum(A row). Rows: 1 + 2^-8 (bf16 tie, even below), 1 + 3*2^-8 (tie up),
    # 1 + 2^-8 + 2^-30 (just above), 1 + 2^-11 (f16 tie), 1 + 2^-24 (f32 tie), ...
    K = 32
    ones = {"kind": "nvfp4", "rows": 1, "K": K, "codes": [0x2] * K, "scales": [[0x38, 0x38]], "scale_2": None}
    targets = [
        [1.0, 2.0 ** -8], [1.0, 3 * 2.0 ** -8], [1.0, 2.0 ** -8, 2.0 ** -30], [1.0, 2.0 ** -8, -2.0 ** -30],
        [1.0, 2.0 ** -11], [1.0, 3 * 2.0 ** -11], [1.0, 2.0 ** -11, 2.0 ** -40], [1.0, 2.0 ** -24],
        [1.0, 3 * 2.0 ** -24], [1.0, 2.0 ** -24, 2.0 ** -60], [-1.0, -2.0 ** -8], [65504.0, 16.0],
        [65504.0, 15.999], [2.0 ** -25, 0.0], [2.0 ** -25, 2.0 ** -40], [2.0 ** -14, 2.0 ** -25],
        [2.0 ** -133, 2.0 ** -134], [2.0 ** -149, 2.0 ** -140], [2.0 ** -126, -2.0 ** -149],
        [3.0e38, 3.0e38], [1.0, -1.0], [-2.0 ** -30, 0.0], [float.fromhex("0x1.fffffep127"), float.fromhex("0x1p103")],
        [float.fromhex("0x1.fffffep127"), float.fromhex("0x1p104")],
    ]
    vals = []
    for t in targets:
        row = [to_f32(v) for v in t] + [0.0] * (K - len(t))
        vals += row
    ck.gemm_case("midpoints", plain("f32", len(targets), K, vals), ones)
    # the same through alpha: A and B nvfp4 with scale_2 making alpha*sum a midpoint
    A1 = {"kind": "nvfp4", "rows": 2, "K": 16, "codes": [0x2] + [0x0] * 15 + [0x3] + [0] * 15,
          "scales": [[0x38], [0x38]], "scale_2": to_f32(1 + 2.0 ** -8)}
    B1 = {"kind": "nvfp4", "rows": 1, "K": 16, "codes": [0x2] + [0] * 15, "scales": [[0x38]], "scale_2": 1.0}
    ck.gemm_case("alpha_mid", A1, B1)
    # overflow and subnormal outputs through alpha
    Aov = rand_nvfp4(rng, 3, 64, 0x70, 0x7E, scale_2=to_f32(3e30))
    Bov = rand_nvfp4(rng, 3, 64, 0x70, 0x7E, scale_2=to_f32(2e7))
    ck.gemm_case("overflow", Aov, Bov)
    Aun = rand_nvfp4(rng, 3, 64, 0x00, 0x10, scale_2=to_f32(1e-20))
    Bun = rand_nvfp4(rng, 3, 64, 0x00, 0x10, scale_2=to_f32(3e-19))
    ck.gemm_case("subnormal_out", Aun, Bun)
    Aun2 = rand_nvfp4(rng, 3, 64, 0x00, 0x30, scale_2=to_f32(1e-10))
    ck.gemm_case("f16_subnormal_out", Aun2, rand_nvfp4(rng, 3, 64, 0x00, 0x30, scale_2=to_f32(1e-3)))
    # alpha itself overflowing / underflowing in f32
    ck.gemm_case("alpha_inf", rand_nvfp4(rng, 2, 32, scale_2=to_f32(1e30)), rand_nvfp4(rng, 2, 32, scale_2=to_f32(1e30)))
    ck.gemm_case("alpha_zero", rand_nvfp4(rng, 2, 32, scale_2=to_f32(1e-30)), rand_nvfp4(rng, 2, 32, scale_2=to_f32(1e-30)))

    # file conventions: scale_2 of shape [1] (compressed-tensors style), U8 NVFP4 scales and
    # no fp4doctor metadata (format from the scale shape), F8_E8M0 MXFP4 scales, decoy names
    A = rand_nvfp4(rng, 3, 48, scale_2=to_f32(0.75))
    A["scale_2_shape"] = [1]
    A["decoy"] = True
    B = rand_nvfp4(rng, 2, 48, scale_2=to_f32(1.5))
    B["scale_dtype"] = "U8"
    B["no_meta"] = True
    ck.gemm_case("file_conventions_nv", A, B)
    A = rand_mxfp4(rng, 3, 64, scale_dtype="F8_E8M0")
    A["no_meta"] = True
    B = rand_mxfp4(rng, 2, 64)
    B["no_meta"] = True
    ck.gemm_case("file_conventions_mx", A, B)
    # alpha from odd scale_2 values: NaN, negative, zero, infinity
    for sa, sb in ((math.nan, 1.0), (-0.5, to_f32(0.3)), (0.0, 1.0), (math.inf, 1.0), (-2.0, -3.0)):
        A = rand_nvfp4(rng, 2, 32, scale_2=sa)
        B = rand_nvfp4(rng, 2, 32, scale_2=sb)
        B["codes"][16:32] = [0] * 16  # one exact-zero dot product: inf * 0 -> NaN
        A["codes"][0:32] = [0] * 32
        ck.gemm_case("alpha_%r_%r" % (sa, sb), A, B, out_dtypes=("f32", "bf16"))
    # enough work for the reference to use several threads (>= 2^20 products)
    M, N, K = (32, 32, 1024)
    ck.gemm_case("threads_nv", rand_nvfp4(rng, M, K, 0x00, 0x7E, scale_2=to_f32(0.01)),
                 rand_nvfp4(rng, N, K, 0x00, 0x7E, scale_2=to_f32(3.0)), out_dtypes=("f32", "bf16"))
    if not quick:
        vals = [to_f32(rng.gauss(0, 1) * 2.0 ** rng.randint(-30, 30)) for _ in range(2 * 16384)]
        ck.gemm_case("threads_f32_mx", plain("f32", 2, 16384, vals[:2 * 16384]),
                     rand_mxfp4(rng, 64, 16384, 100, 150), out_dtypes=("f32",))
        # B wider than one decoded panel (about 16 MiB: N * 1.5 K bytes), rows repeating
        K = 16384
        base = rand_nvfp4(rng, 3, K, 0x00, 0x7E)
        N = 700
        B = {"kind": "nvfp4", "rows": N, "K": K, "scale_2": to_f32(0.5), "layout": "linear",
             "codes": [], "scales": []}
        for n in range(N):
            j = (n * 7) % 3
            B["codes"] += base["codes"][j * K:(j + 1) * K]
            B["scales"].append(base["scales"][j])
        vals = [to_f32(rng.gauss(0, 1)) for _ in range(2 * K)]
        ck.gemm_case("panels", plain("f32", 2, K, vals), B, out_dtypes=("f32", "f16"))

    # round trip: `fp4doctor quantize` output (swizzled layouts, recorded in __metadata__)
    # used directly as gemm operands; the file tensor is named "w"
    for fmt, layout, rows in (("nvfp4", "swizzled", 130), ("mxfp4", "swizzled8x4", 13), ("nvfp4", "linear", 5)):
        K = 160
        bitsW = bits_random_16(rng, BF16, rows * K)
        bitsW = [b if abs(BF16.decode(b)) < 1e4 else b & 0x807F | 0x3F80 for b in bitsW]
        res = ck.quantize_case("rt_" + fmt, "BF16", rows, K, bitsW, fmt=fmt, layout=layout)
        if res is None:
            continue
        outp, Bop = res
        acts = [to_f32(rng.gauss(0, 1)) for _ in range(3 * K)]
        pa = ck.path("rt_act")
        st_write(pa, [("a", "F32", [3, K], raw_from_bits(f32_bits_list(acts), 4))])
        ck.gemm_case("roundtrip_" + fmt + "_" + layout, plain("f32", 3, K, acts), Bop, files=(pa + ":a", outp + ":w"))
        # and quantized x quantized (A from the same file)
        ck.gemm_case("roundtrip_qq_" + fmt + "_" + layout, Bop, Bop, out_dtypes=("f32",),
                     files=(outp + ":w", outp + ":w"))

    # NaN propagation: 0x7F / 0xFF NVFP4 scales, 0xFF MXFP4 scales, NaN/Inf activations
    A = rand_nvfp4(rng, 4, 64, scale_2=to_f32(0.5))
    B = rand_nvfp4(rng, 3, 64, scale_2=to_f32(0.25))
    A["scales"][1][2] = 0x7F
    B["scales"][2][0] = 0x7F
    A["scales"][3][1] = 0xFF
    ck.gemm_case("nan_scales_nv", A, B)
    A = rand_mxfp4(rng, 3, 64)
    B = rand_mxfp4(rng, 2, 64)
    A["scales"][0][1] = 0xFF
    ck.gemm_case("nan_scales_mx", A, B)
    vals = [to_f32(rng.gauss(0, 1)) for _ in range(5 * 32)]
    vals[0] = math.nan
    vals[32] = math.inf
    vals[64] = math.inf
    vals[65] = -math.inf
    vals[96] = -math.inf
    Bz = rand_nvfp4(rng, 3, 32)
    Bz["codes"][0] = 0x0       # inf * 0 -> NaN for B row 0
    Bz["codes"][32] = 0x8      # inf * -0
    Bz["codes"][64] = 0x2      # row 2 of A: +inf and -inf meet the same B row -> NaN
    Bz["codes"][65] = 0x2
    ck.gemm_case("nan_inf_act", plain("f32", 5, 32, vals), Bz)
    b16 = bits_random_16(rng, BF16, 3 * 32)
    b16[0], b16[40] = 0x7F80, 0xFFC0
    ck.gemm_case("nan_inf_bf16", {"kind": "bf16", "rows": 3, "K": 32, "bits": b16}, rand_mxfp4(rng, 2, 32))
    # exact zero results (documented +0) and negative tiny results (-0 after rounding)
    Az = {"kind": "nvfp4", "rows": 2, "K": 16, "codes": [0x8] * 16 + [0x9] + [0] * 15, "scales": [[0x38], [0x01]],
          "scale_2": to_f32(1e-30)}
    Bz = {"kind": "nvfp4", "rows": 1, "K": 16, "codes": [0x2] * 16, "scales": [[0x01]], "scale_2": to_f32(1e-20)}
    ck.gemm_case("zero_signs", Az, Bz)


def find_exe():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    for d in ("build",):
        p = os.path.join(root, d, "fp4doctor")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("fp4doctor")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fp4doctor", default=os.environ.get("FP4DOCTOR_BIN"))
    ap.add_argument("--quick", action="store_true", help="small configuration (for ctest)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=("quantize", "conventions", "gemm"))
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    exe = args.fp4doctor or find_exe()
    if not exe or not os.access(exe, os.X_OK):
        print("verify_spec: no fp4doctor executable (use --fp4doctor PATH)", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="fp4d_verify_")
    ck = Checker(exe, workdir, args.verbose)
    rng = random.Random(args.seed)
    try:
        if args.only in (None, "quantize"):
            quantize_suite(ck, rng, args.quick)
        if args.only in (None, "conventions"):
            convention_suite(ck, rng, args.quick)
        if args.only in (None, "gemm"):
            gemm_suite(ck, rng, args.quick)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print("files kept in " + workdir)
    ck.counts.update(STATS)
    for k in sorted(ck.counts):
        print("  %-62s %d" % (k, ck.counts[k]))
    if ck.failures:
        print("verify_spec: FAIL: %d mismatching case(s)" % len(ck.failures))
        return 1
    print("verify_spec: PASS (seed %d%s)" % (args.seed, ", quick" if args.quick else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
