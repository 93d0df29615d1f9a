//! Checks a GGUF file's hyper-parameters before llama.cpp sees them.
//!
//! llama.cpp validates most of a model file by throwing (caught inside
//! `llama_model_load_from_file`, which then returns NULL), but a few values
//! are checked with `GGML_ASSERT`, which aborts the process, or not at all
//! and then abort later inside a ggml op. A corrupt file or a bad metadata
//! override reaches them. This module reads the metadata with ggml's own
//! GGUF parser (metadata only, no tensor data) and rejects those values
//! first. The checks mirror, for the pinned llama.cpp:
//!
//! * `llama_model::load_hparams` (src/llama-model.cpp): `block_count` in
//!   `1..=LLAMA_MAX_LAYERS`, `nextn_predict_layers <= block_count`, the
//!   expert-count rules, a known `rope.scaling.type`;
//! * `rope.scaling.factor` / `rope.scale_linear` finite and `>= 0`
//!   (context creation turns `1/factor` into an integer);
//! * the graph: RMS/layer norm epsilons must be `>= 0` (`GGML_ASSERT(eps >=
//!   0.0f)` in ggml-cpu), and more KV heads than query heads overflows the
//!   K/V widths (`GGML_ASSERT(ggml_nelements(a) == ne0*ne1*ne2)` in a
//!   reshape).
//!
//! * the vocabulary (`llama_vocab::impl::load`, also for `vocab_only`):
//!   every token text is unique (`GGML_ASSERT(id_to_token.size() ==
//!   token_to_id.size())`), an RWKV vocabulary has a newline token
//!   (`GGML_ASSERT(!ids.empty() && "model vocab missing newline token")`),
//!   and a WordPiece vocabulary has no byte tokens (`GGML_ABORT` in
//!   `token_to_byte`).
//!
//! Overrides are applied the way llama.cpp applies them: an integer
//! override is converted to `u32` (truncating), a float one to `f32`.

use std::ffi::CStr;
use std::path::Path;

use super::MetadataValue;
use crate::error::{Error, Result};
use crate::llama::gguf::Gguf;
use crate::sys;

/// `LLAMA_MAX_LAYERS` (src/llama-hparams.h).
const MAX_LAYERS: u32 = 512;
/// `LLAMA_MAX_EXPERTS` (src/llama-hparams.h).
const MAX_EXPERTS: u32 = 1024;
/// The values `llama_rope_scaling_type_from_string` knows.
const ROPE_SCALING_TYPES: [&str; 4] = ["none", "linear", "yarn", "longrope"];

/// The token texts must be unique: llama.cpp maps text to id and asserts
/// that the map holds every token. An RWKV vocabulary must have a token
/// for "\n" (llama.cpp asserts that tokenizing it gives a token).
fn check_vocab(gguf: &Gguf) -> Result<(), String> {
    let Some((id, kind)) = gguf.find("tokenizer.ggml.tokens") else {
        return Ok(()); // llama.cpp refuses a file without tokens itself
    };
    if kind != sys::gguf_type::GGUF_TYPE_ARRAY {
        return Ok(()); // mistyped: llama.cpp throws
    }
    // SAFETY: a valid key id of an array (type checked above).
    if unsafe { sys::gguf_get_arr_type(gguf.ptr(), id) } != sys::gguf_type::GGUF_TYPE_STRING {
        return Ok(());
    }
    // SAFETY: a valid id of a string array.
    let n = unsafe { sys::gguf_get_arr_n(gguf.ptr(), id) };
    let texts: Vec<&[u8]> = (0..n)
        .map(|i| {
            // SAFETY: `i < n`; the string lives as long as the context,
            // which outlives `texts` (dropped at the end of this function).
            unsafe { CStr::from_ptr(sys::gguf_get_arr_str(gguf.ptr(), id, i)) }.to_bytes()
        })
        .collect();
    let mut seen = std::collections::HashMap::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        if let Some(first) = seen.insert(*text, i) {
            return Err(format!(
                "tokens {first} and {i} of the vocabulary have the same text {:?}",
                String::from_utf8_lossy(text)
            ));
        }
    }
    let model = gguf.string("tokenizer.ggml.model");
    if model.as_deref() == Some("rwkv") && !texts.iter().any(|t| unescape_rwkv(t) == b"\n") {
        return Err("the RWKV vocabulary has no newline token".into());
    }
    // A WordPiece vocabulary renders byte tokens through the SentencePiece
    // path, whose byte lookup aborts for WordPiece (GGML_ABORT in
    // `token_to_byte`) while llama.cpp builds its piece cache at load.
    if model.as_deref() == Some("bert")
        && let Some(types) = gguf.i32_array("tokenizer.ggml.token_type")
        && let Some(i) = types.iter().position(|&t| t == sys::llama_token_type::LLAMA_TOKEN_TYPE_BYTE as i32)
    {
        return Err(format!("token {i} of the WordPiece vocabulary is a byte token, which llama.cpp cannot render"));
    }
    Ok(())
}

/// An RWKV token's bytes, as llama.cpp's `llama_unescape_rwkv_token`
/// unescapes its stored text (`\t`, `\n`, `\r`, `\xHH` with lowercase
/// hex digits read as llama.cpp reads them, `\c` for any other `c`).
fn unescape_rwkv(escaped: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(escaped.len());
    let (mut escaping, mut hex_left, mut hex) = (false, 0u8, 0u8);
    for &c in escaped {
        if hex_left != 0 {
            let value = if c >= b'a' { c.wrapping_sub(b'a').wrapping_add(10) } else { c.wrapping_sub(b'0') };
            hex = (hex << 4).wrapping_add(value);
            hex_left -= 1;
            if hex_left == 0 {
                out.push(hex);
                hex = 0;
            }
        } else if escaping {
            match c {
                b't' => out.push(b'\t'),
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b'x' => hex_left = 2,
                other => out.push(other),
            }
            escaping = false;
        } else if c == b'\\' {
            escaping = true;
        } else {
            out.push(c);
        }
    }
    out
}

/// Checks the model file at `path` (as `c_path`) with `overrides` applied.
pub(super) fn check(path: &Path, c_path: &CStr, overrides: &[(String, MetadataValue)], vocab_only: bool) -> Result<()> {
    let invalid = |reason: String| Error::ModelLoad { path: path.to_owned(), reason };
    crate::llama::backend::clear_last_error();
    let Some(gguf) = Gguf::open(c_path) else {
        return Err(invalid(crate::llama::backend::last_error_or("not a valid GGUF file")));
    };
    check_vocab(&gguf).map_err(invalid)?;
    if vocab_only {
        // llama.cpp stops reading hyper-parameters before these.
        return Ok(());
    }
    let lookup = |key: &str| overrides.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let Some(arch) = (match lookup("general.architecture") {
        Some(MetadataValue::Str(s)) => Some(s.clone()),
        Some(_) => None,
        None => gguf.string("general.architecture"),
    }) else {
        return Ok(()); // llama.cpp rejects a file without an architecture by itself
    };
    let key = |name: &str| format!("{arch}.{name}");
    let scalar_u32 = |name: &str| match lookup(&key(name)) {
        // llama.cpp assigns the i64 to a uint32_t: the same truncation.
        Some(MetadataValue::Int(v)) => Some(*v as u32),
        Some(_) => None, // a mistyped override makes llama.cpp throw
        None => gguf.scalar_u32(&key(name)),
    };
    let per_layer = |name: &str, n_layer: u32| match lookup(&key(name)) {
        Some(MetadataValue::Int(v)) => Some(vec![*v as u32; n_layer as usize]),
        Some(_) => None,
        None => gguf.per_layer_u32(&key(name), n_layer),
    };

    let Some(n_layer) = scalar_u32("block_count") else {
        return Ok(()); // required: llama.cpp throws when it is missing or mistyped
    };
    if !(1..=MAX_LAYERS).contains(&n_layer) {
        return Err(invalid(format!("{} = {n_layer} is outside 1..={MAX_LAYERS}", key("block_count"))));
    }
    let nextn = scalar_u32("nextn_predict_layers").unwrap_or(0);
    if nextn > n_layer {
        return Err(invalid(format!("{} = {nextn} exceeds the block count {n_layer}", key("nextn_predict_layers"))));
    }

    check_experts(&arch, &key, &scalar_u32, &per_layer, n_layer).map_err(invalid)?;

    if let Some(heads) = per_layer("attention.head_count", n_layer)
        && let Some(kv_heads) = per_layer("attention.head_count_kv", n_layer)
    {
        for (il, (&h, &kv)) in heads.iter().zip(&kv_heads).enumerate() {
            if h > 0 && kv > h {
                return Err(invalid(format!("layer {il} has {kv} KV heads but only {h} attention heads")));
            }
        }
    }

    let rope_scaling = match lookup(&key("rope.scaling.type")) {
        Some(MetadataValue::Str(s)) => Some(s.clone()),
        Some(_) => None,
        None => gguf.string(&key("rope.scaling.type")),
    };
    if let Some(s) = rope_scaling
        && !ROPE_SCALING_TYPES.contains(&s.as_str())
    {
        return Err(invalid(format!("unknown {} `{s}`", key("rope.scaling.type"))));
    }

    let float = |name: &str| match lookup(&key(name)) {
        Some(MetadataValue::Float(v)) => Some(*v as f32),
        Some(_) => None,
        None => gguf.scalar_f32(&key(name)),
    };
    // llama.cpp takes 1/factor as the trained frequency scale, and context
    // creation converts a NaN result to an integer (undefined behaviour)
    // while writing it into the shared model.
    for name in ["rope.scaling.factor", "rope.scale_linear"] {
        if let Some(f) = float(name)
            && !(f.is_finite() && f >= 0.0)
        {
            return Err(invalid(format!("{} = {f} must be a finite number >= 0", key(name))));
        }
    }

    for name in ["attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"] {
        let eps = match lookup(&key(name)) {
            Some(MetadataValue::Float(v)) => Some(*v as f32),
            Some(_) => None,
            None => gguf.scalar_f32(&key(name)),
        };
        // NaN is rejected too, as it fails ggml's `eps >= 0.0f`.
        if let Some(eps) = eps
            && (eps.is_nan() || eps < 0.0)
        {
            return Err(invalid(format!("{} = {eps} must be a number >= 0", key(name))));
        }
    }
    Ok(())
}

/// The expert-count rules of `load_hparams`.
fn check_experts(
    arch: &str,
    key: &dyn Fn(&str) -> String,
    scalar_u32: &dyn Fn(&str) -> Option<u32>,
    per_layer: &dyn Fn(&str, u32) -> Option<Vec<u32>>,
    n_layer: u32,
) -> std::result::Result<(), String> {
    let mut n_expert = scalar_u32("expert_count").unwrap_or(0);
    let mut used_max = per_layer("expert_used_count", n_layer).and_then(|v| v.into_iter().max()).unwrap_or(0);
    let groups = scalar_u32("expert_group_count").unwrap_or(0);
    let group_used = scalar_u32("expert_group_used_count").unwrap_or(0);
    if (arch == "hunyuan_vl" || arch == "hunyuan-dense") && n_expert <= 1 {
        n_expert = 0;
        used_max = 0;
    }
    let ok = n_expert <= MAX_EXPERTS
        && used_max <= n_expert
        && if n_expert > 0 {
            used_max > 0
                && groups < n_expert
                && (groups <= 1 || (n_expert.is_multiple_of(groups) && group_used > 0 && group_used < groups))
        } else {
            used_max == 0 && groups == 0
        };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "inconsistent expert counts: {} = {n_expert}, {} = {used_max}, {} = {groups}, {} = {group_used}",
            key("expert_count"),
            key("expert_used_count"),
            key("expert_group_count"),
            key("expert_group_used_count"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::unescape_rwkv;

    #[test]
    fn rwkv_tokens_unescape_as_llama_cpp_unescapes_them() {
        assert_eq!(unescape_rwkv(b"\\n"), b"\n");
        assert_eq!(unescape_rwkv(b"\\x0a"), b"\n");
        assert_eq!(unescape_rwkv(b"a\\tb\\r"), b"a\tb\r");
        assert_eq!(unescape_rwkv(b"\\\\"), b"\\");
        assert_eq!(unescape_rwkv(b"\\q"), b"q");
        // Uppercase hex digits are read as llama.cpp reads them ('A' - '0').
        assert_eq!(unescape_rwkv(b"\\x0A"), [17]);
        assert_eq!(unescape_rwkv(b"plain"), b"plain");
    }
}
