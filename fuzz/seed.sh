#!/usr/bin/env bash
# Writes the seed corpora into fuzz/corpus/<target>/ (gitignored).
# Run from anywhere; builds the fuzz crate first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
. fuzz/env.sh

bin=fuzz/target/x86_64-unknown-linux-gnu/release/make_seeds
if [ ! -x "$bin" ]; then
    cargo fuzz build
fi
mkdir -p fuzz/corpus
# make_seeds runs instrumented (ASan); the fixtures it keeps in statics are
# not leaks.
ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" "$bin" fuzz/corpus

# gguf_load: the three smallest vocab fixtures as real-world GGUF files
# (SentencePiece, WordPiece and another SPM layout), next to the synthetic
# models make_seeds wrote.
for v in bert-bge llama-spm phi-3; do
    f=vendor/llama.cpp/models/ggml-vocab-$v.gguf
    if [ -f "$f" ]; then cp "$f" fuzz/corpus/gguf_load/; fi
done

for d in fuzz/corpus/*/; do
    printf '%-28s %4d files %8d bytes\n' "$d" "$(ls "$d" | wc -l)" "$(du -sb "$d" | cut -f1)"
done
