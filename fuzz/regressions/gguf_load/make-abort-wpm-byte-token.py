#!/usr/bin/env python3
"""Writes the reproducer of fuzz finding 6 (README): a WordPiece (bert)
vocabulary with one token typed BYTE (6). Model::load (vocab_only or not)
then aborts in llama_vocab::impl::token_to_byte (GGML_ABORT "fatal error",
src/llama-vocab.cpp:3207) while building the token-to-piece cache.

The input is the vendored fixture (628 KB, not committed twice):
    python3 fuzz/regressions/gguf_load/make-abort-wpm-byte-token.py \
        vendor/llama.cpp/models/ggml-vocab-bert-bge.gguf /tmp/wpm-byte-token.gguf
    fuzz/target/x86_64-unknown-linux-gnu/release/gguf_load /tmp/wpm-byte-token.gguf
"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main(src, dst, token=1000):
    b = bytearray(open(src, "rb").read())
    assert b[:4] == b"GGUF"
    _, n_kv = struct.unpack_from("<QQ", b, 8)
    o = 24

    def read_str(o):
        (n,) = struct.unpack_from("<Q", b, o)
        return bytes(b[o + 8 : o + 8 + n]), o + 8 + n

    for _ in range(n_kv):
        key, o = read_str(o)
        (t,) = struct.unpack_from("<I", b, o)
        o += 4
        if t == 8:
            _, o = read_str(o)
        elif t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            if key == b"tokenizer.ggml.token_type":
                assert et in (4, 5) and token < n
                struct.pack_into("<i", b, o + 4 * token, 6)  # LLAMA_TOKEN_TYPE_BYTE
                open(dst, "wb").write(b)
                return
            if et == 8:
                for _ in range(n):
                    _, o = read_str(o)
            else:
                o += SIZES[et] * n
        else:
            o += SIZES[t]
    sys.exit("no tokenizer.ggml.token_type array")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
