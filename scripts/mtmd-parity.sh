#!/usr/bin/env bash
# llama.cpp's own llama-mtmd-cli beside this crate's `generate --mmproj` on
# the same model, projector, image and prompt, greedy: the generated texts
# must be equal (the same logits decide every token).
#
# llama-mtmd-cli is built from the pinned source by
# scripts/build-llama-server.sh (EXTRA_TARGETS=llama-mtmd-cli); the
# projector is the synthetic one for the model's width (examples/
# tiny_projector.rs: random weights, so the text says nothing about the
# image, but every step of the image path runs: preprocessing, the
# encoder, the embeddings' decode, then the text); the image is llama.cpp's
# own test-1.jpeg. llama-mtmd-cli always renders a chat template: it gets
# one that writes the message as it is, so both sides tokenize the same
# text (BOS, the media marker where the image goes, special tokens parsed).
#
# Usage: [IMAGE=FILE] scripts/mtmd-parity.sh [MODEL.gguf] [N_TOKENS]
#   (default: $LLAMA_MODEL, else the cached default model; 32 tokens). Prints both texts and
#   exits 1 if they differ.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf 'mtmd-parity: %s\n' "$*" >&2; }

MODEL="${1:-${LLAMA_MODEL:-${LLAMA_CACHE_DIR:-$HOME/.cache/llama-rs}/gemma-3-270m-q4_k_m.gguf}}"
N="${2:-32}"
[[ -f "$MODEL" ]] || { say "no model at $MODEL: pass MODEL.gguf or set LLAMA_MODEL"; exit 2; }

CLI="$(EXTRA_TARGETS=llama-mtmd-cli nice -n 19 bash scripts/build-llama-server.sh | tail -n1)"
WORK="$ROOT/target/mtmd-parity"
mkdir -p "$WORK"
MMPROJ="$WORK/tiny-mmproj.gguf"
cargo run --quiet --example tiny_projector -- --model "$MODEL" "$MMPROJ" >/dev/null
IMAGE="${IMAGE:-$ROOT/target/llama-tools/src/tools/mtmd/test-1.jpeg}"
AS_IS="{{- messages[0]['content'] -}}"
PROMPT="<__media__>A picture of"

say "llama-mtmd-cli ($CLI)"
MTMD_TEST_RESPONSE_MARKER="@@response@@" "$CLI" -m "$MODEL" --mmproj "$MMPROJ" --image "$IMAGE" -p "$PROMPT" \
    -n "$N" --temp 0 -t 2 -c 2048 --jinja --chat-template "$AS_IS" \
    > "$WORK/theirs.out" 2> "$WORK/theirs.log" || { tail -20 "$WORK/theirs.log" >&2; exit 1; }
# After the marker: the newline eval_message writes once the prompt is in,
# then the tokens.
theirs="$(sed -n '/^@@response@@$/,$p' "$WORK/theirs.out" | tail -n +3)"

say "generate --mmproj"
ours="$(cargo run --quiet --example generate -- -m "$MODEL" --mmproj "$MMPROJ" --image "$IMAGE" --prompt "$PROMPT" \
    -n "$N" --greedy --threads 2 --ctx 2048 2> "$WORK/ours.log")" || { tail -20 "$WORK/ours.log" >&2; exit 1; }

printf 'llama-mtmd-cli: %q\ngenerate:       %q\n' "$(echo "$theirs" | sed -e 's/[[:space:]]*$//')" "$(echo "$ours" | sed -e 's/[[:space:]]*$//')"
if [[ "$(echo "$theirs" | sed -e 's/[[:space:]]*$//')" == "$(echo "$ours" | sed -e 's/[[:space:]]*$//')" ]]; then
    say "equal ($N tokens)"
else
    say "DIFFERENT"
    exit 1
fi
